// Trace store: add -> verify passes and `sha256sum -c` agrees; any corruption is named;
// store compare pairs by shape + model and exits with the worst verdict.
// To add a case: make a store with make_store(), damage it, check store_verify's messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "fixtures.h"
#include "test_util.h"
#include "verify/trace/store.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;
namespace fs = std::filesystem;

namespace {

TraceHeader shaped(const std::string& shape, const std::string& device) {
  TraceHeader h = fixture_header();
  h.shape_name = shape;
  h.device = device;
  return h;
}

// Two traces (shapes s1, s2) from `rows`, staged in a scratch dir, added to a new store.
std::string make_store(const std::string& tag, const std::vector<TraceRow>& rows,
                       const std::string& device = "cuda:0 NVIDIA H200") {
  std::string stage = temp_dir(tag + "-stage");
  std::string a = write_trace(stage + "/s1." + tag + ".tsv", shaped("s1", device), rows, 2.5);
  std::string b = write_trace(stage + "/s2." + tag + ".tsv", shaped("s2", device), rows, 3.0);
  std::string dir = temp_dir(tag) + "/store";
  store_add(dir, {a, b});
  return dir;
}

bool mentions(const std::vector<std::string>& problems, const std::string& s) {
  for (const auto& p : problems)
    if (p.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(Store, AddWritesMetadataRunsAndChecksums) {
  std::string dir = make_store("add", six_rows());
  EXPECT_EQ(store_trace_names(dir), (std::vector<std::string>{"s1.add.tsv", "s2.add.tsv"}));
  EXPECT_TRUE(store_verify(dir).empty());
  // GNU coreutils agrees with our SHA256SUMS.
  int rc = std::system(("cd '" + dir + "' && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1").c_str());
  EXPECT_EQ(rc, 0);
  std::string sums = read_file(dir + "/SHA256SUMS");
  EXPECT_NE(sums.find("  s1.add.tsv\n"), std::string::npos);
  EXPECT_NE(sums.find("  METADATA.txt\n"), std::string::npos);
  EXPECT_NE(sums.find("  RUNS.txt\n"), std::string::npos);

  std::string runs = read_file(dir + "/RUNS.txt");
  EXPECT_NE(runs.find("s1.add.tsv\t0\t6\t2.5\t"), std::string::npos) << runs;
  EXPECT_NE(runs.find("s2.add.tsv\t0\t6\t3\t"), std::string::npos) << runs;
  std::string meta = read_file(dir + "/METADATA.txt");
  for (const std::string& s : std::vector<std::string>{"gpu\tNVIDIA H200", "sha256\t" + std::string(64, 'a'),
                               "sha256\t" + std::string(64, 'c'), "shape\ts1\tchunk_tokens\t3",
                               "shape\ts2\t", "build\t0.1.0\tabcdef123456", "store_host\t",
                               "trace\ts1.add.tsv\tshape\ts1"})
    EXPECT_NE(meta.find(s), std::string::npos) << s << "\n" << meta;

  // A second add of a trace with a non-finite value: RUNS.txt marks exit 1; still verifies.
  auto rows = six_rows();
  rows[1].nll = std::nan("");
  std::string stage = temp_dir("add-nan");
  std::string t = write_trace(stage + "/nan.tsv", shaped("s3", "cpu"), rows);
  store_add(dir, {t});
  EXPECT_NE(read_file(dir + "/RUNS.txt").find("nan.tsv\t1\t6\t"), std::string::npos);
  EXPECT_TRUE(store_verify(dir).empty());
  // Adding the same file again is a no-op; different bytes under the same name are refused.
  EXPECT_NO_THROW(store_add(dir, {t}));
  write_trace(t, shaped("s3", "cpu"), six_rows());
  EXPECT_THROW(store_add(dir, {t}), Error);
}

TEST(Store, VerifyNamesCorruptFile) {
  std::string dir = make_store("corrupt", six_rows());
  std::string p = dir + "/s1.corrupt.tsv";
  std::string bytes = read_file(p);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(p, bytes);
  auto problems = store_verify(dir);
  ASSERT_FALSE(problems.empty());
  EXPECT_TRUE(mentions(problems, "s1.corrupt.tsv: checksum mismatch")) << problems[0];
  CliResult r = run_cli("store verify " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("s1.corrupt.tsv"), std::string::npos) << r.err;
  int rc = std::system(("cd '" + dir + "' && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1").c_str());
  EXPECT_NE(rc, 0);  // coreutils sees it too
}

TEST(Store, VerifyFindsIncompleteStrayAndMissing) {
  std::string dir = make_store("stray", six_rows());
  EXPECT_EQ(run_cli("store verify " + dir).exit_code, 0);
  write_file(dir + "/extra.txt", "x");
  EXPECT_TRUE(mentions(store_verify(dir), "extra.txt: not listed in SHA256SUMS"));
  fs::remove(dir + "/extra.txt");
  write_file(dir + "/.RUNS.txt.tmp.999", "half");
  EXPECT_TRUE(mentions(store_verify(dir), ".RUNS.txt.tmp.999: stray hidden file"));
  fs::remove(dir + "/.RUNS.txt.tmp.999");
  EXPECT_TRUE(store_verify(dir).empty());
  fs::remove(dir + "/RUNS.txt");
  auto problems = store_verify(dir);
  EXPECT_TRUE(mentions(problems, "RUNS.txt: listed in SHA256SUMS but missing"));
  EXPECT_TRUE(mentions(problems, "s1.stray.tsv: no line in RUNS.txt"));

  // An incomplete trace is refused by add, and nothing is copied.
  std::string stage = temp_dir("stray-stage");
  std::string t = write_trace(stage + "/cut.tsv", shaped("s9", "cpu"), six_rows());
  std::string text = read_file(t);
  write_file(t, text.substr(0, text.find("# end")));
  EXPECT_THROW(store_add(dir, {t}), Error);
  EXPECT_FALSE(fs::exists(dir + "/cut.tsv"));
  CliResult r = run_cli("store add " + dir + " " + t);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cut.tsv:17:"), std::string::npos) << r.err;
}

TEST(Store, CompareDirectoriesExitWithWorstVerdict) {
  auto ref = six_rows();
  std::string ref_dir = make_store("ref", ref, "ref");
  std::string same = make_store("same", ref, "cpu");
  CliResult r = run_cli("store compare " + ref_dir + " " + same);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("s1.ref.tsv"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("s1.same.tsv"), std::string::npos) << r.out;
  StoreComparison c = store_compare(ref_dir, same, {}, false);
  ASSERT_EQ(c.pairs.size(), 2u);
  EXPECT_EQ(c.pairs[0].shape, "s1");
  EXPECT_EQ(c.pairs[0].cand_name, "s1.same.tsv");

  auto cand = ref;  // decided flip
  cand[0].top_ids = {11, 10, 12};
  cand[0].top_logits = {5.1, 5.0, 1.0};
  std::string bad = make_store("bad", cand, "cpu");
  EXPECT_EQ(run_cli("store compare " + ref_dir + " " + bad).exit_code, 1);

  // A candidate store with only shape s1: s2 is unpaired -> inconclusive.
  std::string stage = temp_dir("half-stage");
  std::string half = temp_dir("half") + "/store";
  store_add(half, {write_trace(stage + "/s1.half.tsv", shaped("s1", "cpu"), ref)});
  r = run_cli("store compare " + ref_dir + " " + half);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("UNPAIRED"), std::string::npos) << r.out;

  // A damaged store makes the comparison unreadable.
  std::string p = same + "/s2.same.tsv";
  std::string bytes = read_file(p);
  bytes[10] = 'X';
  write_file(p, bytes);
  r = run_cli("store compare " + ref_dir + " " + same);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("s2.same.tsv"), std::string::npos) << r.err;
}

TEST(Store, WorstVerdictOrder) {
  EXPECT_EQ(worse_verdict(Verdict::Pass, Verdict::Inconclusive), Verdict::Inconclusive);
  EXPECT_EQ(worse_verdict(Verdict::Fail, Verdict::Inconclusive), Verdict::Fail);
  EXPECT_EQ(worse_verdict(Verdict::Fail, Verdict::Incomparable), Verdict::Incomparable);
  EXPECT_EQ(worse_verdict(Verdict::Unreadable, Verdict::Incomparable), Verdict::Unreadable);
}
