// `arbiter generate` as llama-cli users type it: the prompt from a positional argument, -p,
// -f, -p - or piped stdin gives the same text; a random seed is printed and replays; -n -1
// runs to EOS or the context; penalties and --chat take effect; what it cannot do is refused
// in one line. Each case runs the real binary on the shipped TinyStories model.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <regex>

#include "test_util.h"

namespace arbiter {
namespace {

const std::string kM = test::source_path("models/TinyStories-656K");

// run_cli with stdin from a file holding `in`.
test::CliResult run_with_stdin(const std::string& args, const std::string& in) {
  const std::string dir = test::temp_dir("gen_stdin");
  test::write_file(dir + "/in", in);
  const std::string cmd = std::string(ARBITER_CLI) + " " + args + " <" + dir + "/in >" + dir + "/out 2>" + dir + "/err";
  const int rc = std::system(cmd.c_str());
  test::CliResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = test::read_file(dir + "/out");
  r.err = test::read_file(dir + "/err");
  return r;
}

TEST(GenerateCli, EveryPromptSourceGivesTheSameText) {
  const auto p = test::run_cli("generate -m " + kM + " -p 'Once upon a time' -n 8");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out, ", a little girl named Lily lived in a small house with her mom\n");
  const auto pos = test::run_cli("generate -m " + kM + " 'Once upon a time' -n 8");
  EXPECT_EQ(pos.out, p.out) << pos.err;
  EXPECT_EQ(run_with_stdin("generate -m " + kM + " -n 8", "Once upon a time\n").out, p.out);
  EXPECT_EQ(run_with_stdin("generate -m " + kM + " -p - -n 8", "Once upon a time").out, p.out);
  const std::string dir = test::temp_dir("gen_f");
  test::write_file(dir + "/prompt.txt", "Once upon a time");
  EXPECT_EQ(test::run_cli("generate -m " + kM + " -f " + dir + "/prompt.txt -n 8").out, p.out);
  const auto twice = test::run_cli("generate -m " + kM + " 'a' -p b");
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_NE(twice.err.find("give the prompt once"), std::string::npos) << twice.err;
}

TEST(GenerateCli, RandomSeedIsPrintedAndReplays) {
  const auto a = test::run_cli("generate -m " + kM + " -p 'The dog' -n 16 --temp 1.0");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.err, m, std::regex(R"(\[generate\] seed (\d+))"))) << a.err;
  const auto b = test::run_cli("generate -m " + kM + " -p 'The dog' -n 16 --temp 1.0 --seed " + m[1].str());
  EXPECT_EQ(b.out, a.out);
  EXPECT_EQ(b.err.find("[generate] seed"), std::string::npos) << "a given seed is not announced";
}

TEST(GenerateCli, UntilEosOrContextAndPenalties) {
  const auto all = test::run_cli("generate -m " + kM + " -p 'Once upon a time' -n -1 -c 48");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all.err, m, std::regex(R"((\d+) prompt tokens .*, (\d+) tokens in)"))) << all.err;
  const int prompt = std::stoi(m[1]), gen = std::stoi(m[2]);
  EXPECT_TRUE(prompt + gen == 48 || all.err.find("stopped at EOS") != std::string::npos) << all.err;
  const auto plain = test::run_cli("generate -m " + kM + " -p 'Once upon a time' -n 40");
  const auto pen = test::run_cli("generate -m " + kM + " -p 'Once upon a time' -n 40 --repeat-penalty 1.5 --frequency-penalty 1");
  ASSERT_EQ(pen.exit_code, 0) << pen.err;
  EXPECT_NE(pen.out, plain.out) << "penalties must change a greedy 40-token story";
  for (const char* bad : {"-n -2", "--repeat-penalty 0", "--presence-penalty 3", "--min-p 2 --temp 1", "--mirostat 2"}) {
    const auto r = test::run_cli("generate -m " + kM + " -p x " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
}

TEST(GenerateCli, ChatTurnsFromStdin) {
  const std::string tpl = test::source_path("tests/server/tiny_chat.jinja");
  const auto r = run_with_stdin("generate -m " + kM + " --chat --chat-template " + tpl + " -n 6", "Once upon a time\nThe dog\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_EQ(r.out.rfind(", a little girl named Lily", 0), 0u) << r.out;
  const auto none = run_with_stdin("generate -m " + kM + " --chat", "hi\n");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("has no chat template"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace arbiter
