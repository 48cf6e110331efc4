// llama.cpp's KL-divergence files (verify/trace/kld_file.h) and llama-perplexity's statistics
// (verify/judge/llama_stats.h): the round trip, the reader's refusals, the statistics on a
// case worked by hand, a file llama-perplexity wrote, and llama-perplexity reading ours.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>

#include "core/error.h"
#include "test_util.h"
#include "verify/judge/kld_compare.h"
#include "verify/judge/llama_stats.h"
#include "verify/trace/kld_file.h"

namespace arbiter::verify {
namespace {

const std::string kGguf = test::source_path("models/stories260K/stories260K.gguf");
// Written by llama.cpp 80fb11a (tests/fixtures/kld/README.md has the command).
const std::string kLlamaFile = test::source_path("tests/fixtures/kld/stories260K-c128.kld");

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KldFile, RoundTripIsExactToTheFilesPrecision) {
  KldLayout l;
  l.n_ctx = 8;
  l.n_vocab = 1001;  // odd: the row is padded to an even count
  l.n_chunk = 2;
  for (int k = 0; k < l.n_ctx * l.n_chunk; ++k) l.tokens.push_back((k * 37) % l.n_vocab);
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0, 6);  // spans more than the 16 nats kept
  std::vector<std::vector<float>> rows;
  const std::string path = test::temp_dir("kld") + "/t.kld";
  KldWriter w;
  w.open(path, l);
  for (int r = 0; r < l.n_chunk * l.rows_per_chunk(); ++r) {
    std::vector<float> x(size_t(l.n_vocab));
    for (float& v : x) v = n01(rng);
    w.write_row(x.data());
    rows.push_back(x);
  }
  w.finish();
  const KldReader rd(path);
  EXPECT_EQ(rd.layout().n_ctx, 8);
  EXPECT_EQ(rd.layout().n_vocab, 1001);
  EXPECT_EQ(rd.layout().tokens, l.tokens);
  std::vector<float> lp;
  int clipped = 0;
  for (int c = 0; c < l.n_chunk; ++c)
    for (int r = 0; r < l.rows_per_chunk(); ++r) {
      const std::vector<float>& x = rows[size_t(c * l.rows_per_chunk() + r)];
      rd.read_row(c, r, lp);
      const double mx = *std::max_element(x.begin(), x.end());
      double se = 0;
      for (float v : x) se += std::exp(double(v) - mx);
      const double lse = mx + std::log(se), step = 16.0 / 65535;
      for (int v = 0; v < l.n_vocab; ++v) {
        const double truth = double(x[size_t(v)]) - lse;
        if (x[size_t(v)] > mx - 16) {
          EXPECT_NEAR(lp[size_t(v)], truth, 0.5 * step + 1e-5) << c << " " << r << " " << v;
        } else {  // clipped: the row's floor, 16 nats below its top
          EXPECT_NEAR(lp[size_t(v)], mx - 16 - lse, 1e-5);
          ++clipped;
        }
      }
    }
  EXPECT_GT(clipped, 0);
}

TEST(KldFile, TheReaderRefusesWhatIsNotAWholeFile) {
  const std::string dir = test::temp_dir("kld-bad");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  std::string good;
  {
    std::ifstream f(kLlamaFile, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto with_int = [&](size_t at, int32_t v) {
    std::string s = good;
    std::memcpy(s.data() + at, &v, 4);
    return s;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {write("magic.kld", "_logitz_" + good.substr(8)), "no \"_logits_\" magic"},
      {write("short.kld", good.substr(0, 12)), "shorter than its header"},
      {write("cut.kld", good.substr(0, good.size() - 1)), "bytes, but n_ctx 128"},
      {write("ctx.kld", with_int(8, 2)), "outside [3,"},
      {write("vocab.kld", with_int(12, 0)), "outside [3,"},
      {write("chunks.kld", with_int(16, 1 << 30)), "bytes, but n_ctx"},
      {write("token.kld", with_int(20 + 4 * 5, 512)), "token 5 is 512, outside the vocabulary [0, 512)"},
  };
  for (const auto& [path, what] : cases) {
    const std::string file = path;  // clang 14 cannot capture a structured binding
    const std::string e = error_of([&] { KldReader r(file); });
    EXPECT_NE(e.find("[kld] " + path + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << path << ": " << e;
  }
}

// Base p = (1/2, 1/2) on every row; the candidate (0.8, 0.2); targets alternate 0, 1 over 20
// rows. By hand: KLD = (ln 0.625 + ln 2.5) / 2 = ln(1.5625) / 2 on every row (SE 0); nll
// alternates -ln 0.8, -ln 0.2 (mean ln 2.5 / ... so PPL = sqrt(1/0.16) = 2.5, the spread of
// ln p is ln 2 either side, SE = ln 2 / sqrt(19)); nll_base = ln 2 (PPL 2, SE 0); Δp
// alternates +0.3, -0.3 (mean 0, SE 0.3 / sqrt(19), RMS 0.3); the base's tie goes to id 0,
// the candidate's top, so the top agrees on every row.
TEST(LlamaStats, AHandWorkedCase) {
  LlamaKld acc;
  const float base[2] = {std::log(0.5f), std::log(0.5f)}, cand[2] = {std::log(0.8f), std::log(0.2f)};
  for (int r = 0; r < 20; ++r) acc.add(base, cand, 2, r % 2);
  const LlamaKldStats s = acc.finish();
  const double tol = 1e-6, ln2 = std::log(2.0);
  EXPECT_EQ(s.count, 20);
  EXPECT_NEAR(s.kld.value, std::log(1.5625) / 2, tol);
  EXPECT_NEAR(s.kld.unc, 0, tol);
  EXPECT_NEAR(s.ppl.value, 2.5, tol);
  EXPECT_NEAR(s.ppl.unc, 2.5 * ln2 / std::sqrt(19.0), tol);
  EXPECT_NEAR(s.ppl_base.value, 2.0, tol);
  EXPECT_NEAR(s.ppl_base.unc, 0, tol);
  EXPECT_NEAR(s.ln_ppl_ratio.value, std::log(1.25), tol);
  EXPECT_NEAR(s.ln_ppl_ratio.unc, ln2 / std::sqrt(19.0), tol);
  EXPECT_NEAR(s.ppl_ratio.value, 1.25, tol);
  EXPECT_NEAR(s.ppl_diff.value, 0.5, tol);
  EXPECT_NEAR(s.dp.value, 0, tol);
  EXPECT_NEAR(s.dp.unc, 0.3 / std::sqrt(19.0), tol);
  EXPECT_NEAR(s.rms_dp.value, 0.3, tol);
  EXPECT_NEAR(s.same_top.value, 1.0, tol);
  for (const auto& [f, v] : s.kld_percentiles) EXPECT_NEAR(v, std::log(1.5625) / 2, tol) << f;
  // Δp sorted: ten -0.3 then ten +0.3; the median averages the middle two; 25 % sits at
  // 4.75 of 19 steps, 75 % at 14.25.
  for (const auto& [f, v] : s.dp_percentiles) {
    const double want = f == 0.5 ? 0.0 : f < 0.5 ? -0.3 : 0.3;
    EXPECT_NEAR(v, want, tol) << f;
  }
}

// The fixture was written by llama-perplexity from its own run of stories260K; arbiter's ref
// tier evaluates the same tokens (--kld-tokens) and compare reads both files.
TEST(KldFile, LlamaCppsFileAgainstArbitersRefTier) {
  const std::string dir = test::temp_dir("kld-llama");
  auto r = test::run_cli("trace -m " + kGguf + " --kld-tokens " + kLlamaFile + " --kld-out " + dir +
                         "/ref.kld --device ref --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_cli("compare " + kLlamaFile + " " + dir + "/ref.kld --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["rows"], 4 * 63);
  // llama-perplexity printed "Final estimate: PPL = 4.5621 +/- 0.51313" for that run.
  EXPECT_NEAR(j["ppl_base"]["value"].get<double>(), 4.5621, 5e-5);
  EXPECT_NEAR(j["ppl_base"]["se"].get<double>(), 0.51313, 5e-6);
  // Two f32-class engines on one model: the 16-bit quantization of both files is the floor.
  EXPECT_LT(std::fabs(j["kld"]["value"].get<double>()), 1e-4);
  EXPECT_GE(j["same_top_p"]["value"].get<double>(), 0.99);
  // Different tokens are refused, naming both files.
  r = test::run_cli("trace -m " + kGguf + " --corpus " + test::source_path("models/corpus/stories.txt") +
                    " --kld-ctx 64 --chunks 4 --kld-out " + dir + "/other.kld --device ref --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_cli("compare " + kLlamaFile + " " + dir + "/other.kld");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("differ"), std::string::npos) << r.err;
}

// Two arbiter traces with full logits: compare reports llama-perplexity's statistics beside its
// own. A fault makes the KL large enough that both definitions of it (llama.cpp leaves out
// base entries below -16 nats) agree to 1e-4; without full logits the JSON says what is needed.
TEST(LlamaStats, CompareOfTracesWithFullLogits) {
  const std::string dir = test::temp_dir("kld-compare"), C = test::source_path("models/corpus/stories.txt");
  for (const std::string side : {"ref", "cpu"}) {
    auto r = test::run_cli("trace -m " + kGguf + " --corpus " + C + " --shape w256 --chunks 1 --device " + side +
                           (side == "cpu" ? " --inject op=q,layer=1,scale=1.05" : "") + " -o " + dir + "/" + side +
                           ".tsv --full-logits " + dir + "/" + side + ".tsv.logits --quiet");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto r = test::run_cli("compare " + dir + "/ref.tsv " + dir + "/cpu.tsv --json");
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["llama_perplexity"].contains("kld")) << r.out;
  const double kl = j["kl"]["mean"]["mean"].get<double>(), lk = j["llama_perplexity"]["kld"]["value"].get<double>();
  EXPECT_GT(kl, 1e-5);
  EXPECT_NEAR(lk, kl, 1e-4 * kl);
  EXPECT_EQ(j["llama_perplexity"]["rows"], 256);
  // The base side as f32 log-probabilities, as in a KLD file: equal to f32 rounding.
  EXPECT_NEAR(j["llama_perplexity"]["ppl_base"]["value"].get<double>(), j["nll"]["ppl_ref"].get<double>(), 1e-6);
  r = test::run_cli("compare " + dir + "/ref.tsv " + dir + "/cpu.tsv --topk-only");
  EXPECT_NE(r.out.find("llama-perplexity statistics: need full logits on both sides"), std::string::npos) << r.out;
}

// llama-perplexity --kl-divergence reads a base file arbiter wrote: its PPL(base), computed
// from our file alone, equals ours to the digits it prints.
TEST(KldFile, LlamaPerplexityReadsArbitersFile) {
  const char* env = std::getenv("ARBITER_LLAMA_PERPLEXITY");
  const std::string peer = env && *env ? env : test::shared_path("peers/llama.cpp/build/bin/llama-perplexity");
  if (!std::ifstream(peer).good())
    GTEST_SKIP() << "SKIP: llama-perplexity not built ($ARBITER_LLAMA_PERPLEXITY, or ../shared/PEERS.md's "
                    "peers/llama.cpp/build/bin/llama-perplexity)";
  const std::string dir = test::temp_dir("kld-peer");
  auto r = test::run_cli("trace -m " + kGguf + " --corpus " + test::source_path("models/corpus/stories.txt") +
                         " --kld-ctx 128 --chunks 4 --kld-out " + dir + "/base.kld --device ref --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string out = dir + "/llama.txt";
  const std::string cmd = peer + " -m " + kGguf + " --kl-divergence-base " + dir + "/base.kld --kl-divergence -c 128 -b 128"
                          " -t 2 > " + out + " 2> " + dir + "/llama.err";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(Mean PPL\(base\)\s*:\s*([0-9.]+) ± +([0-9.]+))"))) << text;
  const LlamaKldStats ours = compare_kld_files(dir + "/base.kld", dir + "/base.kld");
  EXPECT_NEAR(std::stod(m[1]), ours.ppl_base.value, 1e-6);
  EXPECT_NEAR(std::stod(m[2]), ours.ppl_base.unc, 1e-6);
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(Same top p:\s*([0-9.]+))"))) << text;
  EXPECT_GE(std::stod(m[1]), 99.0);
}

}  // namespace
}  // namespace arbiter::verify
