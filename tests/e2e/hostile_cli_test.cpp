// The hostile-input catalogue through the real `arbiter` binary (docs/reliability.md), one
// test per class: FIFO inputs (must not hang: each run is bounded by `timeout`), device and
// FIFO outputs, an output naming an input, huge counts and ids, non-finite values in logits
// files, contexts past the model's maximum, thread counts, signals and stale temporaries.
// Every refusal must be one line "arbiter CMD: [component] PATH: ..." with a non-zero exit,
// never "unexpected error", std::bad_alloc, a hang or a destroyed file. Add a case: make the
// bad input under a temp_dir, run it through hostile(), state the words the line must hold.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "io/io_test_util.h"
#include "test_util.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

const std::string kModel = test::source_path("models/TinyStories-656K");
const std::string kCorpus = test::source_path("models/corpus/stories.txt");

// Runs the CLI under `timeout 60` and checks the refusal is clean: a non-zero exit that is
// not the timeout's, one line on stderr naming the command, no crash words.
test::CliResult hostile(const std::string& args, std::initializer_list<std::string> words) {
  test::CliResult r = test::run_cli_bounded(args, 60);
  EXPECT_NE(r.exit_code, 0) << args;
  EXPECT_NE(r.exit_code, 124) << "hung: " << args;
  EXPECT_NE(r.exit_code, -1) << "killed by a signal: " << args;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  // Progress lines (\r) and notes end before the error line; the error line is the last.
  const std::string last = err.substr(err.find_last_of('\n') + 1);
  EXPECT_EQ(last.rfind("arbiter ", 0), 0u) << args << "\n" << r.err;
  for (const char* bad : {"unexpected error", "bad_alloc", "max_size", "terminate", "Assertion", "Sanitizer"})
    EXPECT_EQ(r.err.find(bad), std::string::npos) << args << "\n" << r.err;
  for (const std::string& w : words) EXPECT_NE(last.find(w), std::string::npos) << "missing '" << w << "': " << last;
  return r;
}

std::string make_fifo(const std::string& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

std::string copy_model(const std::string& tag) {
  std::string dir = test::temp_dir(tag) + "/m";
  fs::copy(kModel, dir, fs::copy_options::recursive);
  return dir;
}

std::string trace_args(const std::string& corpus, const std::string& out, const std::string& extra = "") {
  return "trace -m " + kModel + " --corpus " + corpus + " --shape w1 --chunks 2 --device cpu --quiet -o " + out +
         " " + extra;
}

// A reference trace (and its full-logits file) to build bad inputs from.
std::string good_trace() {
  static std::string path;
  if (path.empty()) {
    path = test::temp_dir("hostile-good") + "/ref.tsv";
    test::CliResult r = test::run_cli(trace_args(kCorpus, path, "--full-logits " + path + ".logits"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  return path;
}

pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st;
  ::waitpid(pid, &st, 0);
  return pid;
}

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST(HostileCli, FifoInputsAreRefusedNotWaitedOn) {
  const std::string dir = test::temp_dir("hostile-fifo");
  const std::string f = make_fifo(dir + "/fifo.gguf"), t = make_fifo(dir + "/fifo.tsv");
  hostile("info " + f, {"fifo.gguf", "is a FIFO"});
  hostile("compare " + good_trace() + " " + t, {"fifo.tsv", "is a FIFO"});
  hostile(trace_args(t, dir + "/o.tsv"), {"fifo.tsv", "is a FIFO"});
  hostile("tokenize -m " + kModel + " --file " + t, {"fifo.tsv", "is a FIFO"});
  hostile("matrix run " + t + " -o " + dir + "/mx", {"fifo.tsv", "is a FIFO"});
  hostile("gate -m " + kModel + " --prompts " + t + " --sides ref,cpu", {"fifo.tsv", "is a FIFO"});
  // Inside an HF directory: config.json and tokenizer.json (read by different readers).
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
    std::string m = copy_model("hostile-fifo");
    fs::remove(m + "/" + name);
    make_fifo(m + "/" + name);
    hostile("info " + m, {name, "is a FIFO"});
  }
  // The full-logits side file compare picks up by convention.
  const std::string side = dir + "/side.tsv";
  fs::copy_file(good_trace(), side);
  make_fifo(side + ".logits");
  fs::copy_file(good_trace() + ".logits", dir + "/ref2.tsv.logits");
  fs::copy_file(good_trace(), dir + "/ref2.tsv");
  hostile("compare " + dir + "/ref2.tsv " + side, {"side.tsv.logits", "is a FIFO"});
}

TEST(HostileCli, DevicesAsInputs) {
  hostile(trace_args("/dev/zero", test::temp_dir("hostile-dev") + "/o.tsv"), {"/dev/zero", "a character device"});
  hostile("tokenize -m " + kModel + " --file /dev/zero", {"/dev/zero", "a character device"});
  hostile("info /dev/null", {"/dev/null"});
  hostile("compare /dev/stdin " + good_trace(), {"/dev/stdin"});
}

TEST(HostileCli, OutputsNeverReplaceDevicesFifosOrDirectories) {
  const std::string dir = test::temp_dir("hostile-out");
  const std::string f = make_fifo(dir + "/out.fifo");
  hostile(trace_args(kCorpus, "/dev/null"), {"/dev/null", "is a character device; refusing to replace it"});
  hostile(trace_args(kCorpus, dir + "/o.tsv", "--full-logits " + f), {"out.fifo", "is a FIFO; refusing"});
  hostile(trace_args(kCorpus, dir), {"is a directory; refusing"});
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(fs::exists(dir + "/o.tsv"));  // nothing half-written either
  EXPECT_TRUE(temporaries(dir).empty());
}

TEST(HostileCli, AnOutputNamingAnInputIsRefused) {
  const std::string dir = test::temp_dir("hostile-same");
  const std::string corpus = dir + "/corpus.txt", model = dir + "/m.gguf";
  fs::copy_file(kCorpus, corpus);
  fs::copy_file(test::source_path("models/stories260K/stories260K.gguf"), model);
  const std::string corpus_bytes = test::read_file(corpus), model_bytes = test::read_file(model);
  hostile(trace_args(corpus, corpus), {"corpus.txt", "refusing to overwrite it"});
  hostile(trace_args(corpus, dir + "/o.tsv", "--full-logits " + corpus), {"corpus.txt", "refusing to overwrite it"});
  hostile(trace_args(corpus, dir + "/o.tsv", "--full-logits " + dir + "/./o.tsv"),
          {"names both the trace and the full-logits file"});
  hostile("trace -m " + model + " --corpus " + corpus + " --shape w1 --chunks 2 --device cpu --quiet -o " + model,
          {"m.gguf", "refusing to overwrite it"});
  hostile("drift -m " + kModel + " --corpus " + corpus + " --a ref --b cpu --positions 8 --svg " + corpus,
          {"corpus.txt", "refusing to overwrite it"});
  EXPECT_EQ(test::read_file(corpus), corpus_bytes);
  EXPECT_EQ(test::read_file(model), model_bytes);
  EXPECT_TRUE(temporaries(dir).empty());
}

TEST(HostileCli, HugeCountsAndIds) {
  const std::string dir = test::temp_dir("hostile-huge");
  // GGUF block_count 5e7 (std::bad_alloc before).
  std::string gguf = test::read_file(test::source_path("models/stories260K/stories260K.gguf"));
  std::string key;
  test::put_str(key, "llama.block_count");
  const uint32_t layers = 50'000'000;
  std::memcpy(&gguf[gguf.find(key) + key.size() + 4], &layers, 4);
  test::write_file(dir + "/layers.gguf", gguf);
  hostile("info " + dir + "/layers.gguf", {"layers.gguf", "llama.block_count is 50000000"});
  // tokenizer.json id 1e8 (an abort before) and 2^31 - 1.
  for (int64_t id : {int64_t(100'000'000), int64_t(2'147'483'647)}) {
    std::string m = copy_model("hostile-huge");
    auto j = nlohmann::json::parse(test::read_file(m + "/tokenizer.json"));
    j["model"]["vocab"]["zzzz"] = id;
    test::write_file(m + "/tokenizer.json", j.dump());
    hostile("info " + m, {"tokenizer.json", "model.vocab['zzzz']", std::to_string(id)});
    hostile("tokenize -m " + m + " hi", {"tokenizer.json", std::to_string(id)});
  }
  // A trace without rows may claim any K: compare sized a table from it (std::bad_alloc).
  std::string zero;
  std::istringstream in(test::read_file(good_trace()));
  for (std::string l; std::getline(in, l);) {
    if (l[0] != '#') continue;
    if (l.rfind("# shape", 0) == 0) {
      const size_t k = l.find("\ttopk\t") + 6;
      l.replace(k, l.find("\tprefill") - k, "1000000000000000");
    }
    if (l.rfind("# end", 0) == 0) l = "# end\trows\t0\telapsed_s\t0";
    zero += l + "\n";
  }
  test::write_file(dir + "/zero.tsv", zero);
  test::CliResult z = test::run_cli_bounded("compare " + dir + "/zero.tsv " + dir + "/zero.tsv", 60);
  EXPECT_EQ(z.exit_code, 2) << z.out << z.err;  // inconclusive: no position at all
  EXPECT_NE(z.out.find("no decided position"), std::string::npos) << z.out << z.err;
  // CLI counts that do not fit an int (they wrapped to small values before).
  hostile("trace -m " + kModel + " --corpus " + kCorpus + " --chunk 4294967297 --chunks 1 -o " + dir + "/o.tsv",
          {"--chunk 4294967297 is outside [1, 2147483647]"});
  hostile("generate -m " + kModel + " -p hi --ctx 4294967297",
          {"--ctx 4294967297 passes the model's maximum of 512 positions"});
  hostile("generate -m " + kModel + " -p hi -n 100000000", {"-n 100000000 exceeds the model's 512 positions"});
}

TEST(HostileCli, FaultsThatCannotApplyAreRefused) {
  // Each ran fault-free while the trace header recorded the injection. Now the first forward
  // that reaches the logits without having met the fault's stage fails, naming the stages
  // the model has (engine/session.h), before any token is printed.
  EXPECT_EQ(hostile("generate -m " + kModel + " -p hi -n 2 --inject op=down,layer=2,scale=2",
                    {"has no stage 'down' at layer 2", "layers 0-1"})
                .out,
            "");
  EXPECT_EQ(hostile("generate -m " + kModel + " -p hi -n 2 --inject op=logits,layer=0,scale=2",
                    {"has no stage 'logits' at layer 0"})
                .out,
            "");
  EXPECT_EQ(hostile("generate -m " + kModel + " -p hi -n 2 --inject op=q_norm,scale=2", {"has no stage 'q_norm'"}).out,
            "");
  // 1e11 did not fit the int it was converted to.
  hostile("generate -m " + kModel + " -p hi -n 2 --inject op=down,layer=99999999999,scale=2", {"layer must be"});
  hostile("generate -m " + kModel + " -p hi -n 2 --seed -1", {"--seed -1 must be >= 0"});
}

TEST(HostileCli, ThreadCountsAreCappedOrRefused) {
  // -t 100000 aborted in the thread pool's constructor.
  test::CliResult r = test::run_cli_bounded("generate -m " + kModel + " -p hi -n 2 -t 100000", 60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--threads 100000 capped at the"), std::string::npos) << r.err;
  hostile("generate -m " + kModel + " -p hi -n 2 -t -1", {"--threads -1 is outside"});
}

TEST(HostileCli, NonFiniteLogitsFailTheVerdict) {
  const std::string dir = test::temp_dir("hostile-nan");
  const std::string ref = good_trace(), cand = dir + "/cand.tsv";
  fs::copy_file(ref, cand);
  std::string logits = test::read_file(ref + ".logits");
  const float nan = std::nanf("");
  std::memcpy(&logits[31 + 4 * 17], &nan, 4);  // row 0, token 17: never a top-k logit
  test::write_file(cand + ".logits", logits);
  // Was: the NaN row skipped, "non-finite values: 0", exit 0.
  test::CliResult r = test::run_cli_bounded("compare " + ref + " " + cand, 60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("non-finite values in the full-logits files: ref 0, cand 1"), std::string::npos) << r.out;
  // A NaN in the trace itself: counted by the reader, also a failure.
  std::string text = test::read_file(ref);
  size_t row = text.find("\n0\t0\t");
  size_t nll = text.find('\t', text.find('\t', text.find('\t', text.find('\t', row + 1) + 1) + 1) + 1) + 1;
  text.replace(nll, text.find('\t', nll) - nll, "nan");
  test::write_file(dir + "/cand2.tsv", text);
  r = test::run_cli_bounded("compare " + ref + " " + dir + "/cand2.tsv --topk-only", 60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("non-finite values: ref 0, cand 1"), std::string::npos) << r.out;
}

TEST(HostileCli, ContextPastTheModelsMaximum) {
  const std::string dir = test::temp_dir("hostile-ctx");
  // TinyStories-656K has 512 positions; a chunk of 600 (or w8: BOS + 512 + 8) runs past them.
  hostile("trace -m " + kModel + " --corpus " + kCorpus + " --chunk 600 --chunks 1 -o " + dir + "/a.tsv",
          {"601 positions", "maximum is 512", "--allow-long-context"});
  hostile("trace -m " + kModel + " --corpus " + kCorpus + " --shape w8 --chunks 1 -o " + dir + "/b.tsv",
          {"shape w8", "521 positions"});
  test::CliResult r = test::run_cli_bounded("trace -m " + kModel + " --corpus " + kCorpus +
                                                " --shape w8 --chunks 1 --device cpu --quiet --allow-long-context -o " +
                                                dir + "/c.tsv",
                                            120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(test::read_file(dir + "/c.tsv").find("\n# long_context\tpositions\t521\tmax_positions\t512\n"),
            std::string::npos);
  // Within the maximum nothing is recorded.
  r = test::run_cli_bounded(trace_args(kCorpus, dir + "/d.tsv"), 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(dir + "/d.tsv").find("long_context"), std::string::npos);
  // Sessions sized past the maximum: one line naming the model's limit (issue 32; before,
  // generate said only "outside [1, 512]" and serve "outside [2, 512]").
  hostile("generate -m " + kModel + " -p hi -n 2 --ctx 2048",
          {"generate: --ctx 2048 passes the model's maximum of 512 positions"});
  hostile("generate -m " + kModel + " --chat --chat-template " +
              test::source_path("tests/fixtures/chat_templates/qwen2.5.jinja") + " -p hi -n 2 --ctx 2048",
          {"generate: --ctx 2048 passes the model's maximum of 512 positions"});
  hostile("serve -m " + kModel + " --port 0 --ctx 2048", {"serve: --ctx 2048 passes the model's maximum of 512 positions"});
  hostile("serve -m " + kModel + " --port 0 --ctx 1", {"serve: --ctx 1 is below 2"});
  // bench measures speed there on purpose (docs/performance.md): a warning, and it runs.
  r = test::run_cli_bounded("bench -m " + kModel + " --depth 600 -p 8 -n 2 -r 1 --no-probes", 120);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[bench] warning: --depth 600 + max(-p 8, -n 2) = 608 positions passes the model's maximum "
                       "of 512"),
            std::string::npos)
      << r.err;
  r = test::run_cli_bounded("bench -m " + kModel + " -p 8 -n 2 -r 1 --no-probes", 120);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

TEST(HostileCli, InterruptedTraceLeavesNoTemporaryAndStaleOnesAreRemoved) {
  const std::string dir = test::temp_dir("hostile-sig");
  const std::string out = dir + "/t.tsv";
  // A stale temporary of a killed run (SIGKILL cannot be caught): removed by the next run.
  const std::string stale = out + ".logits.tmp." + std::to_string(dead_pid());
  test::write_file(stale, "partial");
  for (int sig : {SIGINT, SIGTERM}) {
    pid_t pid = ::fork();
    if (pid == 0) {
      // Long enough to be interrupted: 12800 positions on the ref tier (seconds).
      ::execl(ARBITER_CLI, ARBITER_CLI, "trace", "-m", kModel.c_str(), "--corpus", kCorpus.c_str(), "--chunk", "64",
              "--chunks", "200", "--device", "ref", "--quiet", "-o", out.c_str(), "--full-logits",
              (out + ".logits").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // The full-logits temporary exists from the first chunk on.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (fs::exists(stale) || temporaries(dir).empty()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no temporary appeared";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_FALSE(fs::exists(stale)) << "a dead process's temporary was kept";
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st;
    EXPECT_TRUE(temporaries(dir).empty()) << "signal " << sig << " left " << temporaries(dir)[0];
    EXPECT_FALSE(fs::exists(out));
  }
}
