// Logprobs dumps as a compare side (docs/traces.md §4): the committed replies of `arbiter
// serve` (tests/verify/logprobs/, made by make_fixtures.py) in OpenAI's echo shape (tokens as
// ids, and as text) and vLLM's prompt_logprobs shape are read into the rows of the in-process
// ref trace of the same chunks, and compare passes them saying which statistics hold for
// log-probabilities; malformed dumps are refused with file and line. To add a refusal: a
// line of JSON and the expected message in DumpRefusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "verify/judge/compare.h"
#include "verify/trace/api_trace.h"
#include "verify/trace/logprobs_jsonl.h"
#include "verify/trace/trace.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

const std::string kModel = source_path("models/TinyStories-656K");
const std::string kDumps = source_path("tests/verify/logprobs");

// The in-process ref trace of the chunks the fixtures' prompts hold (make_fixtures.py).
const std::string& ref_trace() {
  static const std::string path = [] {
    const std::string p = temp_dir("logprobs-ref") + "/ref.tsv";
    CliResult r = run_cli("trace -m " + kModel + " --device ref --corpus " +
                          source_path("models/corpus/stories.txt") +
                          " --chunk 4 --chunks 3 --prefill 4 --topk 5 -o " + p + " --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

// The dump's rows are the ref trace's, as log-probabilities (logit - lse), to the precision
// the trace file carries (%.9g).
void expect_rows_of_ref(const Trace& d, int64_t k) {
  const Trace R = read_trace(ref_trace());
  ASSERT_EQ(d.rows.size(), R.rows.size());
  EXPECT_EQ(d.header.topk, k);
  for (size_t i = 0; i < d.rows.size(); ++i) {
    const TraceRow &a = d.rows[i], &r = R.rows[i];
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(a.chunk, r.chunk);
    EXPECT_EQ(a.pos, r.pos);
    EXPECT_EQ(a.target, r.target);
    EXPECT_EQ(a.abs_pos, -1);
    EXPECT_EQ(a.lse, 0);
    EXPECT_NEAR(a.nll, r.nll, 1e-7 * std::max(1.0, std::fabs(r.nll)));
    ASSERT_EQ(a.top_ids.size(), size_t(k));
    for (size_t j = 0; j < size_t(k); ++j) {
      EXPECT_EQ(a.top_ids[j], r.top_ids[j]);
      EXPECT_NEAR(a.top_logits[j], r.top_logits[j] - r.lse, 1e-7 * std::max(1.0, std::fabs(r.top_logits[j])));
    }
  }
}

std::string error_of(const std::string& text, const LogprobsJsonlOptions& opt = {}) {
  try {
    parse_logprobs_jsonl(text, "d.jsonl", opt);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

// A minimal OpenAI echo reply: prompt tokens 1 2 3, each scored one with a top list.
nlohmann::json echo_reply() {
  return nlohmann::json::parse(R"({"choices": [{"index": 0, "logprobs": {
      "tokens": ["token_id:1", "token_id:2", "token_id:3", "token_id:9"],
      "token_logprobs": [null, -0.5, -1.5, -0.1],
      "top_logprobs": [null, {"token_id:2": -0.5, "token_id:4": -1.0},
                       {"token_id:4": -0.25, "token_id:5": -1.0, "token_id:3": -1.5},
                       {"token_id:9": -0.1}],
      "text_offset": [0, 1, 2, 3]}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})");
}

}  // namespace

TEST(LogprobsJsonl, OpenAiEchoWithIdsIsTheRefTrace) {
  LogprobsJsonlOptions opt;
  opt.window = 4;
  const Trace d = read_logprobs_jsonl(kDumps + "/openai-ids.jsonl", opt);
  EXPECT_EQ(d.format, TraceFormat::LogprobsJsonl);
  EXPECT_TRUE(holds_logprobs(d));
  EXPECT_FALSE(d.has_abs_pos);
  // arbiter serve returns exactly the top 5; K drops to 4 only where the target is 5th.
  expect_rows_of_ref(d, 4);
}

TEST(LogprobsJsonl, VllmPromptLogprobsIsTheRefTrace) {
  LogprobsJsonlOptions opt;
  opt.window = 4;
  // Ranked entries are exact: all 5 count.
  expect_rows_of_ref(read_logprobs_jsonl(kDumps + "/vllm.jsonl", opt), 5);
}

TEST(LogprobsJsonl, TokenTextNeedsATokenizer) {
  LogprobsJsonlOptions opt;
  opt.window = 4;
  try {
    read_logprobs_jsonl(kDumps + "/openai-text.jsonl", opt);
    FAIL() << "token text accepted without a tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("openai-text.jsonl:1 prompt token 6: token ', a ' is text, not an id: "
                                         "give --tokenizer MODEL"),
              std::string::npos)
        << e.what();
  }
  const std::unique_ptr<Tokenizer> tok = tokenizer_from_hf_dir(kModel);
  opt.tokenizer = tok.get();
  const Trace d = read_logprobs_jsonl(kDumps + "/openai-text.jsonl", opt);
  expect_rows_of_ref(d, 4);
  bool mapped = false;
  for (const auto& [k, v] : d.header.extra) mapped |= k == "logprobs_jsonl" && v.find("mapped from text") != std::string::npos;
  EXPECT_TRUE(mapped);
}

TEST(LogprobsJsonl, CompareTakesADumpOnEitherSide) {
  const std::string ref = ref_trace();
  // The window comes from the other side's chunk_tokens; the report says what holds.
  CliResult r = run_cli("compare " + ref + " " + kDumps + "/openai-ids.jsonl");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("logprobs dump: shape openai_echo lines 3 window 4 (the other side's chunk_tokens)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("compared as log-probabilities"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("log-probability of ref top-1 token, cand - ref (not raw logits)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-k log-probabilities with the tail as one bucket: a lower bound"), std::string::npos)
      << r.out;
  r = run_cli("compare " + kDumps + "/vllm.jsonl " + ref + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["top1_logit_delta"]["units"], "logprob");
  EXPECT_EQ(j["positions"], 12);
  EXPECT_EQ(j["top1"]["disagree"], 0);
  // Token text: refused without --tokenizer (one line, exit 4), read with it.
  r = run_cli("compare " + ref + " " + kDumps + "/openai-text.jsonl");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("is text, not an id"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_cli("compare " + ref + " " + kDumps + "/openai-text.jsonl --tokenizer " + kModel);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // Two dumps: every scored prompt position (9 a line), unless --window says otherwise.
  r = run_cli("compare " + kDumps + "/vllm.jsonl " + kDumps + "/openai-ids.jsonl --json");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["positions"], 27);
  r = run_cli("compare " + kDumps + "/vllm.jsonl " + kDumps + "/openai-ids.jsonl --json --window 2");
  EXPECT_EQ(nlohmann::json::parse(r.out)["positions"], 6);
  // A window that disagrees with the trace's chunks is an identity mismatch, not a guess.
  r = run_cli("compare " + ref + " " + kDumps + "/openai-ids.jsonl --window 3");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  r = run_cli("compare " + ref + " " + ref + " --window 3");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("apply to a logprobs dump"), std::string::npos) << r.err;
}

TEST(LogprobsJsonl, AgainstAForeignTraceOnlyShiftInvariantStatistics) {
  const std::string dir = temp_dir("logprobs-foreign");
  // The ref trace's rows as another engine's 6-column TSV: raw logits, no lse.
  const Trace R = read_trace(ref_trace());
  std::string tsv = "# engine\tother\n";
  for (const TraceRow& r : R.rows) {
    tsv += std::to_string(r.chunk) + "\t" + std::to_string(r.pos) + "\t" + std::to_string(r.target) + "\t" +
           format_trace_float(r.nll) + "\t";
    for (size_t k = 0; k < r.top_ids.size(); ++k) tsv += (k ? "," : "") + std::to_string(r.top_ids[k]);
    tsv += "\t";
    for (size_t k = 0; k < r.top_logits.size(); ++k) tsv += (k ? "," : "") + format_trace_float(r.top_logits[k]);
    tsv += "\n";
  }
  write_file(dir + "/foreign.tsv", tsv);
  LogprobsJsonlOptions opt;
  opt.window = 4;
  const CompareResult c =
      compare_traces(read_trace(dir + "/foreign.tsv"), read_logprobs_jsonl(kDumps + "/vllm.jsonl", opt), {});
  EXPECT_EQ(c.verdict, Verdict::Pass);
  EXPECT_EQ(c.logit_units, "shifted");
  EXPECT_EQ(c.top1_logit_delta.n, 0);  // not computed: the rows differ by an unknown shift
  EXPECT_EQ(c.kl_method, "unavailable");
  EXPECT_EQ(c.spread_shift.n, 12);     // shift-invariant
  EXPECT_NEAR(c.spread_shift.mean, 0, 1e-6);
  EXPECT_NEAR(c.nll_shift.mean, 0, 1e-6);
  EXPECT_NE(format_report(c).find("cand - ref: n/a (raw logits without lse against log-probabilities)"),
            std::string::npos);
}

TEST(LogprobsJsonl, TopKIsWhatEveryRowHoldsExactly) {
  // Row 1's list ends with its own token (-1.5 after two likelier ones): OpenAI's "up to
  // logprobs + 1" extra, not the 3rd most likely token; so it holds 2 exact entries, and K
  // is 2 for the whole dump.
  Trace t = parse_logprobs_jsonl(echo_reply().dump() + "\n", "d.jsonl", {});
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.header.topk, 2);
  EXPECT_EQ(t.rows[1].target, 3);
  EXPECT_EQ(t.rows[1].nll, 1.5);
  EXPECT_EQ(t.rows[1].top_ids, (std::vector<int32_t>{4, 5}));
  // vLLM: ranks 1..m are exact and the prompt token ranked 9 is no top entry; the target is
  // prompt_token_ids[i] when the reply has them, else the dict's first key.
  auto vllm = nlohmann::ordered_json::parse(R"({"choices": [{"prompt_logprobs": [null,
      {"4": {"logprob": -0.25, "rank": 1}, "3": {"logprob": -3.0, "rank": 9}, "5": {"logprob": -1.0, "rank": 2}}],
      "prompt_token_ids": [1, 3]}]})");
  t = parse_logprobs_jsonl(vllm.dump() + "\n", "d.jsonl", {});
  ASSERT_EQ(t.rows.size(), 1u);
  EXPECT_EQ(t.rows[0].target, 3);
  EXPECT_EQ(t.rows[0].nll, 3.0);
  EXPECT_EQ(t.rows[0].top_ids, (std::vector<int32_t>{4, 5}));
  vllm["choices"][0].erase("prompt_token_ids");
  t = parse_logprobs_jsonl(vllm.dump() + "\n", "d.jsonl", {});
  EXPECT_EQ(t.rows[0].target, 4);
  EXPECT_EQ(t.rows[0].nll, 0.25);
}

TEST(LogprobsJsonl, DumpRefusals) {
  nlohmann::json two = echo_reply();
  two["choices"].push_back(two["choices"][0]);
  nlohmann::json no_usage = echo_reply();
  no_usage.erase("usage");
  nlohmann::json null_lp = echo_reply();
  null_lp["choices"][0]["logprobs"]["token_logprobs"][2] = nullptr;
  nlohmann::json bad_name = echo_reply();
  bad_name["choices"][0]["logprobs"]["tokens"][1] = "token_id:x";
  nlohmann::json vllm = nlohmann::json::parse(R"({"choices": [{"prompt_logprobs": [null,
      {"7": {"logprob": -0.5, "rank": 1}}]}]})");
  struct Case {
    const char* name;
    std::string text;
    int64_t window;
    std::string want;
  } cases[] = {
      {"not_json", "{\"choices\": [\n", 0, "d.jsonl:1: not valid JSON"},
      {"two_choices", two.dump() + "\n", 0, "d.jsonl:1: expected a completions reply with one choice (one prompt, n = 1), got 2 choices"},
      {"no_usage", no_usage.dump() + "\n", 0, "d.jsonl:1: no usage.prompt_tokens"},
      {"null_logprob", null_lp.dump() + "\n", 0, "d.jsonl:1 prompt token 2: no logprob (null)"},
      {"bad_name", bad_name.dump() + "\n", 0, "d.jsonl:1 prompt token 1: token name 'token_id:x' is not token_id:<id>"},
      {"window", echo_reply().dump() + "\n", 3, "d.jsonl:1: the prompt scores 2 positions, fewer than the window 3"},
      {"mixed", echo_reply().dump() + "\n" + vllm.dump() + "\n", 0, "d.jsonl:2: a vllm_prompt_logprobs reply after openai_echo ones"},
      {"blank", echo_reply().dump() + "\n\n", 0, "d.jsonl:2: empty line"},
      {"truncated", echo_reply().dump(), 0, "d.jsonl:1: last line has no newline"},
      {"empty", "", 0, "d.jsonl:1: empty file"},
      {"no_choices", "{}\n", 0, "d.jsonl:1: expected a completions reply with one choice (one prompt, n = 1), got no 'choices' list"},
  };
  for (const auto& c : cases) {
    LogprobsJsonlOptions opt;
    opt.window = c.window;
    const std::string msg = error_of(c.text, opt);
    EXPECT_EQ(msg.rfind("[trace] d.jsonl:", 0), 0u) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": " << msg;
  }
}

// Random truncations and byte edits of the committed dumps: the reader either accepts or
// throws arbiter::Error -- never crashes or throws anything else -- and what it accepts goes
// through compare against the ref trace. Seeded; the seed and case print on failure.
TEST(LogprobsJsonl, FuzzNeverCrashes) {
  const std::string bases[] = {read_file(kDumps + "/openai-ids.jsonl"), read_file(kDumps + "/vllm.jsonl")};
  const Trace ref = read_trace(ref_trace());
  std::mt19937 rng(2028);
  const char alphabet[] = "0123456789{}[]\",:.-en tokid_\n";
  int accepted = 0, refused = 0;
  for (int it = 0; it < 600; ++it) {
    std::string s = bases[it % 2];
    for (int e = 0, edits = 1 + int(rng() % 3); e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0: s.resize(at); break;
        case 1: s[at] = char(rng() % 256); break;
        case 2: s[at] = alphabet[rng() % (sizeof alphabet - 1)]; break;
        case 3: s.erase(at, 1 + rng() % 8); break;
      }
    }
    try {
      LogprobsJsonlOptions opt;
      opt.window = it % 3 == 0 ? 0 : 4;
      const Trace t = parse_logprobs_jsonl(s, "f.jsonl", opt);
      ++accepted;
      (void)to_json(compare_traces(ref, t, {})).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "seed 2028 iteration " << it << ": non-arbiter exception " << e.what();
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);  // e.g. an edited digit in a logprob
}
