#include "test_util.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"

namespace arbiter::test {

std::string source_path(const std::string& rel) { return std::string(ARBITER_SOURCE_DIR) + "/" + rel; }

std::string shared_path(const std::string& rel) {
  std::string p = std::string(ARBITER_SHARED_DIR) + "/" + rel;
  return std::filesystem::exists(p) ? p : "";
}

namespace {
struct TempRoot {
  std::string path;
  TempRoot() {
    char tmpl[] = "/tmp/arbiter-test-XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p ? p : "/tmp";
  }
  ~TempRoot() {
    std::error_code ec;
    if (path != "/tmp") std::filesystem::remove_all(path, ec);
  }
};
TempRoot& temp_root() {
  static TempRoot root;
  return root;
}
}  // namespace

std::string temp_dir(const std::string& tag) {
  static int counter = 0;
  std::string p = temp_root().path + "/" + tag + "-" + std::to_string(counter++);
  std::filesystem::create_directories(p);
  return p;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

CliResult run_cli(const std::string& args) { return run_cli_bounded(args, 0); }

CliResult run_cli_bounded(const std::string& args, int seconds) {
  std::string dir = temp_dir("cli");
  std::string out = dir + "/out", err = dir + "/err";
  std::string bound = seconds > 0 ? "timeout -k 5 " + std::to_string(seconds) + " " : "";
  std::string cmd = bound + std::string(ARBITER_CLI) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int rc = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::vector<int32_t> greedy_by_summarize(Session& s, const std::vector<int32_t>& prompt, int n) {
  s.reset();
  s.prefill(prompt);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    const int T = s.last_T();
    ids.push_back(s.summarize(1, std::vector<int32_t>(size_t(T), -1))[size_t(T - 1)].top_ids[0]);
    if (i + 1 < n) s.forward({ids.back()});
  }
  return ids;
}

std::vector<int32_t> sampled_by_rows(Session& s, const std::vector<int32_t>& prompt, int n,
                                     const SamplerParams& p) {
  Sampler sampler(p);
  s.reset();
  s.prefill(prompt);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(sampler.sample(s.logits(s.last_T() - 1)));
    if (i + 1 < n) s.forward({ids.back()});
  }
  return ids;
}

std::vector<int32_t> greedy_by_pick(Session& s, const std::vector<int32_t>& prompt, int n) {
  s.reset();
  s.prefill(prompt);
  std::vector<int32_t> ids;
  s.pick();
  for (int i = 1; i < n; ++i) {
    s.forward_picked();
    s.pick();
    ids.push_back(s.take_pick());
  }
  ids.push_back(s.take_pick());
  return ids;
}

Tensor weight(const Model& m, const char* role, int layer) {
  const Tensor* t = m.weights.find(role, layer);
  return t ? *t : Tensor{};
}

LlamaLayer llama_layer(const Model& m, int l) {
  LlamaLayer r;
  const std::pair<const char*, Tensor*> roles[] = {
      {"attn_norm", &r.attn_norm}, {"wq", &r.wq},         {"wk", &r.wk},
      {"wv", &r.wv},               {"bq", &r.bq},         {"bk", &r.bk},
      {"bv", &r.bv},               {"q_norm", &r.q_norm}, {"k_norm", &r.k_norm},
      {"wo", &r.wo},               {"ffn_norm", &r.ffn_norm}, {"w_gate", &r.w_gate},
      {"w_up", &r.w_up},           {"w_down", &r.w_down}};
  for (const auto& [role, t] : roles) *t = weight(m, role, l);
  return r;
}

double max_reference_logit_error(const Model& m, Backend& be, const std::string& reference_json) {
  const nlohmann::json ref = nlohmann::json::parse(read_file(reference_json));
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int> positions = ref["positions"].get<std::vector<int>>();
  Session s(m, be, int(prompt.size()));
  s.forward(prompt);
  double worst = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const std::vector<double> want = ref["logits"][i].get<std::vector<double>>();
    const std::vector<double> got = s.logits(positions[i]);
    ARB_CHECK(got.size() == want.size(), "%s: position %d has %zu logits, the reference %zu",
              reference_json.c_str(), positions[i], got.size(), want.size());
    for (size_t v = 0; v < want.size(); ++v) worst = std::max(worst, std::fabs(got[v] - want[v]));
  }
  return worst;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

Outcome collect(SeqStream& s) {
  Outcome o;
  for (int i = 0; i < 100000; ++i) {
    auto ev = s.next(std::chrono::milliseconds(100));
    if (!ev) continue;
    if (ev->kind == SeqEvent::Kind::Prompt) o.prompt = ev->prompt;
    if (ev->kind == SeqEvent::Kind::Token) {
      o.ids.push_back(ev->token.id);
      o.tokens.push_back(ev->token);
    }
    if (ev->kind == SeqEvent::Kind::Finished) {
      o.finish = ev->finish;
      o.error = ev->error;
      return o;
    }
  }
  ADD_FAILURE() << "sequence never finished";
  return o;
}

std::vector<SeqRequest> greedy_requests(const Model& m, int n) {
  const char* texts[] = {"Once upon a time", "The dog", "Lily and Ben went to the park to play with a red ball. They",
                         "One day", "Tom had a big box of toys and he did not want to share them with his sister", "A",
                         "The sun was hot and the children wanted to swim in the lake near the old house where"};
  std::vector<SeqRequest> r;
  for (int i = 0; i < n; ++i) {
    SeqRequest q;
    q.prompt = m.tokenizer->encode(texts[i % 7], true, false);
    q.max_tokens = 6 + (i * 5) % 11;
    r.push_back(q);
  }
  return r;
}

std::vector<Outcome> run_all(Scheduler& s, const std::vector<SeqRequest>& reqs) {
  std::vector<std::shared_ptr<SeqStream>> streams;
  for (const SeqRequest& r : reqs) {
    streams.push_back(s.submit(r));
    EXPECT_NE(streams.back(), nullptr);
  }
  std::vector<Outcome> out;
  for (auto& st : streams) out.push_back(st ? collect(*st) : Outcome{});
  return out;
}

}  // namespace arbiter::test
