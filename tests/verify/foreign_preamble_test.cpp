// Foreign 6-column traces that start with an engine's loader lines (docs/traces.md §3): the
// reader skips a bounded preamble before the first '#' line and records it, compare reports
// it in its notes and JSON, junk after the header and junk that never reaches one are still
// refused, an arbiter trace gets no preamble, and the header variants in use all read.
// To add a case: write a file with foreign() and check read_trace or the compare output.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixtures.h"
#include "test_util.h"
#include "verify/judge/compare.h"
#include "verify/trace/trace.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

const std::string kLoader =
    "[NemotronH] Loading config...\n"
    "[NemotronH] Config loaded: 52 layers (23 mamba, 6 attention, 0 mlp, 23 moe)\n"
    "[NemotronH] Loading weights from safetensors...\n"
    "[NemotronH] Building model...\n"
    "[NemotronH] Model loaded successfully\n";

const std::string kHeader =
    "# model\tmodels/mlx/NVIDIA-Nemotron-3-Nano-30B-A3B-4bit\n"
    "# device\tGPU\n"
    "# start_token\t0\n"
    "# contiguous\t1\n";

const std::string kRows =
    "chunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n"
    "0\t0\t10\t1\t10,11,12\t5,2,1\n"
    "0\t1\t20\t0.5\t20,21,22\t6,5.5,1\n";

std::string foreign(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = dir + "/" + name;
  write_file(p, text);
  return p;
}

}  // namespace

TEST(ForeignPreamble, SkippedAndRecorded) {
  const std::string dir = temp_dir("preamble");
  Trace t = read_trace(foreign(dir, "noisy.tsv", kLoader + kHeader + kRows));
  EXPECT_EQ(t.format, TraceFormat::Foreign);
  EXPECT_EQ(t.preamble.lines, 5);
  EXPECT_EQ(t.preamble.first, "[NemotronH] Loading config...");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[1].target, 20);
  ASSERT_EQ(t.header.extra.size(), 4u);
  EXPECT_EQ(t.header.extra[0].first, "model");

  // Without a preamble nothing is recorded; CRLF loader lines are recorded without the CR;
  // blank lines belong to the preamble; a long first line is cut on a character boundary.
  EXPECT_EQ(read_trace(foreign(dir, "clean.tsv", kHeader + kRows)).preamble.lines, 0);
  t = read_trace(foreign(dir, "crlf.tsv", "Loading...\r\n\r\n" + kHeader + kRows));
  EXPECT_EQ(t.preamble.lines, 2);
  EXPECT_EQ(t.preamble.first, "Loading...");
  std::string long_line = "x";
  for (int i = 0; i < 150; ++i) long_line += "\xc3\xa9";  // 301 bytes
  t = read_trace(foreign(dir, "long.tsv", long_line + "\n" + kHeader + kRows));
  EXPECT_EQ(t.preamble.first.size(), 199u);  // 200 would split an "é"
  EXPECT_EQ(t.preamble.first, long_line.substr(0, 199));
}

TEST(ForeignPreamble, HeaderVariantsRead) {
  const std::string dir = temp_dir("preamble-variants");
  // With or without # start_token, # contiguous, # device, in any order, with or without the
  // column header line.
  const char* variants[] = {"# model\tm\n",
                            "# model\tm\n# device\tGPU\n",
                            "# model\tm\n# start_token\t512\n",
                            "# contiguous\t0\n# model\tm\n",
                            "# model\tm\n# device\tGPU\n# start_token\t0\n# contiguous\t1\n"};
  int i = 0;
  for (const char* h : variants) {
    for (bool loader : {false, true}) {
      SCOPED_TRACE(std::string(h) + (loader ? " with loader lines" : ""));
      Trace t = read_trace(foreign(dir, "v" + std::to_string(i++) + ".tsv", (loader ? kLoader : "") + h + kRows));
      EXPECT_EQ(t.rows.size(), 2u);
      EXPECT_EQ(t.preamble.lines, loader ? 5 : 0);
    }
  }
  Trace t = read_trace(foreign(dir, "nocols.tsv", kLoader + "# device\tGPU\n0\t0\t10\t1\t10,11\t5,2\n"));
  EXPECT_EQ(t.rows.size(), 1u);
}

TEST(ForeignPreamble, JunkIsStillRefused) {
  const std::string dir = temp_dir("preamble-junk");
  auto expect = [&](const std::string& name, const std::string& text, const std::string& want) {
    const std::string p = foreign(dir, name, text);
    const std::string msg = read_trace_error(p);
    EXPECT_NE(msg.find("[trace] " + p + ":"), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << name << ": one line";
  };
  // After the header, every line is trace data again.
  expect("after_header", kLoader + kHeader + "Loading more...\n" + kRows, ":10: row has 1 columns");
  expect("after_rows", kLoader + kHeader + kRows + "[NemotronH] done\n", ":13: row has 1 columns");
  // Loader text, then rows without a header: the rows cannot be told from noise.
  expect("row_in_preamble", kLoader + "0\t0\t10\t1\t10,11\t5,2\n# model\tm\n",
         ":6: a trace row after 5 non-trace lines");
  // Never reaching a header: refused after a bounded read, naming line 1.
  expect("no_header", "hello\nworld\n", ":1: not a trace: no '#' header line or trace row in its 2 lines (line 1: 'hello')");
  std::string many;
  for (int i = 0; i < 1000; ++i) many += "loading " + std::to_string(i) + "\n";
  expect("too_many_lines", many + kHeader + kRows, ":1: not a trace: no '#' header line within the first 1000 lines / 1048576 bytes (line 1: 'loading 0')");
  expect("too_many_bytes", std::string(2 << 20, 'x') + "\n" + kHeader + kRows, "within the first 1000 lines / 1048576 bytes (line 1: 'xxxx");
  // An arbiter trace starts on line 1: no preamble, whatever precedes it.
  const std::string arb = read_file(write_trace(dir + "/arb.tsv", fixture_header(), six_rows()));
  expect("arbiter", kLoader + arb, ":6: 5 lines before '# arbiter-trace'");
  // Exactly 999 lines of noise are still a preamble.
  std::string most;
  for (int i = 0; i < 999; ++i) most += "loading " + std::to_string(i) + "\n";
  EXPECT_EQ(read_trace(foreign(dir, "most.tsv", most + kHeader + kRows)).preamble.lines, 999);
}

TEST(ForeignPreamble, CompareReportsItOnEitherSide) {
  const std::string dir = temp_dir("preamble-compare");
  const std::string noisy = foreign(dir, "noisy.tsv", kLoader + kHeader + kRows);
  const std::string clean = foreign(dir, "clean.tsv", kHeader + kRows);
  const std::string other = foreign(dir, "other.tsv", "Loading other engine\n" + kHeader + kRows);
  auto json_of = [&](const std::string& a, const std::string& b) {
    CliResult r = run_cli("compare " + a + " " + b + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return nlohmann::json::parse(r.out);
  };
  // One side.
  nlohmann::json j = json_of(clean, noisy);
  EXPECT_EQ(j["ref"]["preamble"]["lines"], 0);
  EXPECT_TRUE(j["ref"]["preamble"]["first"].is_null());
  EXPECT_EQ(j["cand"]["preamble"]["lines"], 5);
  EXPECT_EQ(j["cand"]["preamble"]["first"], "[NemotronH] Loading config...");
  bool noted = false;
  for (const auto& n : j["notes"])
    noted |= n.get<std::string>() ==
             "cand: skipped 5 preamble lines before its first '#' header line (first: '[NemotronH] Loading config...')";
  EXPECT_TRUE(noted) << j["notes"].dump();
  // Both sides, in the report's notes.
  CliResult r = run_cli("compare " + noisy + " " + other);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("note: ref: skipped 5 preamble lines"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: cand: skipped 1 preamble lines before its first '#' header line (first: 'Loading other "
                       "engine')"),
            std::string::npos)
      << r.out;
  j = json_of(noisy, other);
  EXPECT_EQ(j["ref"]["preamble"]["lines"], 5);
  EXPECT_EQ(j["cand"]["preamble"]["lines"], 1);
  // A file that is no trace: exit 4 with one line naming it.
  const std::string junk = foreign(dir, "junk.txt", "this is not a trace\n");
  r = run_cli("compare " + junk + " " + clean);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find(junk + ":1: not a trace"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
