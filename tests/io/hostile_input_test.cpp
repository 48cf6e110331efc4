// Hostile inputs and outputs at the io layer (src/io/file.h, atomic_file.h, gguf, safetensors;
// docs/reliability.md): anything that is not a regular file is refused without blocking,
// inputs read whole have a size limit, outputs never replace a device, a FIFO, a directory or
// an input, temporaries never outlive their process, and every count in a GGUF or
// safetensors file is checked before anything is sized from it. Add a case: build the bytes
// (GgufBuilder, safetensors_bytes) or the file system object, and state the words the one-line
// refusal must contain.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "io/gguf.h"
#include "io/io_test_util.h"
#include "io/safetensors.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Runs fn in a child process and reports whether it finished within `seconds` (a regression
// to a blocking open() must fail the test, not hang the suite).
bool finishes_within(int seconds, const std::function<void()>& fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      fn();
    } catch (...) {
    }
    ::_exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return false;
}

std::string fifo(const std::string& dir, const std::string& name) {
  std::string p = dir + "/" + name;
  EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
  return p;
}

std::string unix_socket(const std::string& dir) {
  // sun_path is short: bind in a short-named directory of our own.
  std::string p = dir + "/s";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", p.c_str());
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << p;
  ::close(fd);
  return p;
}

// A pid that is not running (a child that has exited and been reaped).
pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st;
  ::waitpid(pid, &st, 0);
  return pid;
}

}  // namespace

// ---- inputs: regular files only -----------------------------------------------------------

TEST(HostileInput, FifoIsRefusedWithoutBlocking) {
  std::string dir = test::temp_dir("hostile");
  std::string f = fifo(dir, "model.gguf");
  EXPECT_TRUE(finishes_within(10, [&] { InputFile in(f, "[gguf]"); })) << "open() of a FIFO blocked";
  EXPECT_TRUE(finishes_within(10, [&] { GgufFile g(f); }));
  std::string e = error_of([&] { GgufFile g(f); });
  EXPECT_NE(e.find("[gguf] " + f + ": is a FIFO (expected a regular file)"), std::string::npos) << e;
}

TEST(HostileInput, EveryNonRegularTypeIsNamed) {
  std::string dir = test::temp_dir("hostile");
  struct Case {
    std::string path, type;
  } cases[] = {{dir, "a directory"},
               {"/dev/null", "a character device"},
               {"/dev/zero", "a character device"},
               {fifo(dir, "f"), "a FIFO"},
               {unix_socket(dir), "a socket"}};
  for (const Case& c : cases) {
    std::string e = error_of([&] { read_input_file(c.path, "[x]", 1 << 20, "a test input"); });
    EXPECT_NE(e.find("[x] " + c.path + ": is " + c.type + " (expected a regular file)"), std::string::npos) << e;
  }
  std::string e = error_of([&] { read_input_file(dir + "/absent", "[x]", 1 << 20, "a test input"); });
  EXPECT_NE(e.find("absent: cannot open (No such file or directory)"), std::string::npos) << e;
}

TEST(HostileInput, SizeLimitBeforeAnyBuffer) {
  std::string p = test::temp_dir("hostile") + "/big.txt";
  test::write_file(p, "");
  // Sparse: 2^40 bytes claimed, nothing stored. Reading it would be std::bad_alloc.
  ASSERT_EQ(::truncate(p.c_str(), off_t(1) << 40), 0);
  std::string e = error_of([&] { read_input_file(p, "[trace]", kMaxInputBytes, "a corpus"); });
  EXPECT_NE(e.find("[trace] " + p + ": 1099511627776 bytes, over the 268435456-byte limit for a corpus"),
            std::string::npos)
      << e;
}

// ---- outputs: never destroy -----------------------------------------------------------------

TEST(HostileOutput, DeviceFifoAndDirectoryAreNotReplaced) {
  std::string dir = test::temp_dir("hostile");
  std::string f = fifo(dir, "out.tsv");
  for (const auto& [path, type] : {std::pair<std::string, std::string>{"/dev/null", "a character device"},
                                   {f, "a FIFO"},
                                   {dir, "a directory"}}) {
    const std::string out = path;  // clang 14 cannot capture a structured binding
    std::string e = error_of([&] { write_file_atomic(out, "x", "[trace]"); });
    EXPECT_NE(e.find("[trace] " + path + ": is " + type + "; refusing to replace it"), std::string::npos) << e;
  }
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(HostileOutput, AnOpenInputIsNotOverwrittenUnderAnyName) {
  std::string dir = test::temp_dir("hostile");
  std::string corpus = dir + "/corpus.txt", link = dir + "/other-name.txt";
  test::write_file(corpus, "precious");
  ASSERT_EQ(::link(corpus.c_str(), link.c_str()), 0);  // same inode, another name
  {
    InputFile in(corpus, "[trace]");
    for (const std::string& out : {corpus, link, dir + "/./corpus.txt"}) {
      std::string e = error_of([&] { write_file_atomic(out, "trace", "[trace]"); });
      EXPECT_NE(e.find("refusing to overwrite it"), std::string::npos) << out << ": " << e;
    }
    // An output opened before the input was: refused at commit, the temporary removed.
    AtomicFile late;
    std::string other = dir + "/late.txt";
    test::write_file(other, "also precious");
    late.open(other, "[trace]");
    late.write("x");
    InputFile in2(other, "[trace]");
    const std::string tmp = late.temp_path();
    ASSERT_TRUE(fs::exists(tmp));
    std::string e = error_of([&] { late.commit(); });
    EXPECT_NE(e.find("is also an input of this run"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(tmp));
    EXPECT_EQ(test::read_file(other), "also precious");
  }
  EXPECT_EQ(test::read_file(corpus), "precious");
  write_file_atomic(corpus, "replaced", "[trace]");  // no longer an input
  EXPECT_EQ(test::read_file(corpus), "replaced");
}

TEST(HostileOutput, TwoOutputsOfOneRunCannotShareAFile) {
  std::string dir = test::temp_dir("hostile");
  AtomicFile a, b;
  a.open(dir + "/t.tsv", "[logits]");
  std::string e = error_of([&] { b.open(dir + "/./t.tsv", "[trace]"); });
  EXPECT_NE(e.find("is already an output of this run"), std::string::npos) << e;
}

TEST(HostileOutput, PlantedSymlinkAtTheTemporaryIsNotWrittenThrough) {
  std::string dir = test::temp_dir("hostile");
  std::string victim = dir + "/victim", out = dir + "/out.tsv";
  test::write_file(victim, "keep");
  std::string tmp = out + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0);
  write_file_atomic(out, "trace", "[trace]");
  EXPECT_EQ(test::read_file(victim), "keep");
  EXPECT_EQ(test::read_file(out), "trace");
}

TEST(HostileOutput, StaleTemporariesOfDeadProcessesAreRemoved) {
  std::string dir = test::temp_dir("hostile");
  std::string out = dir + "/x.tsv";
  std::string stale = out + ".logits.tmp." + std::to_string(dead_pid());
  std::string stale_trace = out + ".tmp." + std::to_string(dead_pid());
  std::string live = out + ".tmp." + std::to_string(::getppid());  // a running process
  std::string unrelated = dir + "/y.tsv.tmp." + std::to_string(dead_pid());
  for (const auto& p : {stale, stale_trace, live, unrelated}) test::write_file(p, "partial");
  write_file_atomic(out, "trace", "[trace]");
  write_file_atomic(out + ".logits", "logits", "[logits]");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_FALSE(fs::exists(stale_trace));
  EXPECT_TRUE(fs::exists(live)) << "a live process's temporary must be left alone";
  EXPECT_TRUE(fs::exists(unrelated)) << "only temporaries of the output being written are removed";
  EXPECT_EQ(atomic_temp_pid("x.tsv.tmp.123"), 123);
  EXPECT_EQ(atomic_temp_pid("x.tsv"), 0);
  EXPECT_EQ(atomic_temp_pid("x.tmp.12a"), 0);
}

TEST(HostileOutput, SignalRemovesTheTemporaries) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old;
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) {  // e.g. SIGHUP under nohup: kept ignored by design
      std::printf("SKIP signal %d: ignored by this process's parent\n", sig);
      continue;
    }
    std::string dir = test::temp_dir("hostile");
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      AtomicFile a, b;
      a.open(dir + "/t.tsv", "[trace]");
      b.open(dir + "/t.tsv.logits", "[logits]");
      a.write("partial");
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(3);
      for (;;) ::pause();
    }
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    EXPECT_EQ(fs::directory_iterator(dir) != fs::directory_iterator(), true);  // temporaries exist
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "signal " << sig << ": status " << st;
    EXPECT_EQ(fs::directory_iterator(dir), fs::directory_iterator()) << "signal " << sig << " left a temporary";
    ::close(ready[0]);
    ::close(ready[1]);
  }
}

// ---- GGUF: counts, lengths and offsets against the file -----------------------------------

namespace {

std::string gguf_error(const std::string& bytes) {
  return error_of([&] { GgufFile g(MappedFile::from_bytes("h.gguf", bytes)); });
}

std::string header(uint64_t n_tensors, uint64_t n_kv) {
  std::string s = "GGUF";
  test::put<uint32_t>(s, 3);
  test::put<uint64_t>(s, n_tensors);
  test::put<uint64_t>(s, n_kv);
  return s;
}

}  // namespace

TEST(HostileGguf, CountsAndLengthsBeyondTheFile) {
  const uint64_t huge = uint64_t(1) << 63;
  EXPECT_NE(gguf_error(header(huge, 0)).find("tensor count 9223372036854775808 cannot fit"), std::string::npos);
  EXPECT_NE(gguf_error(header(0, ~uint64_t(0))).find("kv count"), std::string::npos);
  // A key whose length is 2^63.
  std::string s = header(0, 1);
  test::put<uint64_t>(s, huge);
  s += std::string(64, 'k');
  EXPECT_NE(gguf_error(s).find("metadata key at offset 24 has length 9223372036854775808"), std::string::npos)
      << gguf_error(s);
  // An array of 2^62 u64 elements in a small file.
  s = header(0, 1);
  test::put_str(s, "a");
  test::put<uint32_t>(s, 9);
  test::put<uint32_t>(s, 10);
  test::put<uint64_t>(s, uint64_t(1) << 62);
  s += std::string(64, '\0');
  EXPECT_NE(gguf_error(s).find("more than the"), std::string::npos) << gguf_error(s);
}

TEST(HostileGguf, DimensionsAndOffsetsThatOverflow) {
  auto one_tensor = [](std::vector<uint64_t> ne, uint64_t offset) {
    std::string s = header(1, 0);
    test::put_str(s, "t");
    test::put<uint32_t>(s, uint32_t(ne.size()));
    for (uint64_t d : ne) test::put<uint64_t>(s, d);
    test::put<uint32_t>(s, 0);  // F32
    test::put<uint64_t>(s, offset);
    while (s.size() % 32) s += '\0';
    return s + std::string(64, '\0');
  };
  // A "negative" dimension (-1 as u64), an element count past 2^63, a byte size that wraps.
  EXPECT_NE(gguf_error(one_tensor({~uint64_t(0)}, 0)).find("dimension 0 is 18446744073709551615"), std::string::npos);
  EXPECT_NE(gguf_error(one_tensor({uint64_t(1) << 32, uint64_t(1) << 32}, 0)).find("element count overflows"),
            std::string::npos);
  EXPECT_NE(gguf_error(one_tensor({uint64_t(1) << 62}, 0)).find("byte size overflows"), std::string::npos);
  // An offset near 2^64: offset + size must not wrap around to "inside the file".
  EXPECT_NE(gguf_error(one_tensor({4}, ~uint64_t(0) - 31)).find("runs past end of file"), std::string::npos);
  EXPECT_EQ(gguf_error(one_tensor({4}, 0)), "(no error)");  // 16 of the 64 data bytes: fits
}

// ---- safetensors: header, offsets, index ----------------------------------------------------

TEST(HostileSafetensors, HeaderLengthsOffsetsAndNesting) {
  auto err = [](const std::string& bytes) {
    return error_of([&] { SafetensorsSet::from_bytes("m.safetensors", bytes); });
  };
  std::string s;
  test::put<uint64_t>(s, uint64_t(1) << 63);
  EXPECT_NE(err(s + "{}").find("exceeds the 100 MB limit"), std::string::npos);
  const std::string t = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[)";
  EXPECT_NE(err(test::safetensors_bytes(t + "18446744073709551615,18446744073709551615]}}", "")).find("bad data_offsets"),
            std::string::npos);
  EXPECT_NE(err(test::safetensors_bytes(t + "0,8]}}", "")).find("past end of file"), std::string::npos);
  EXPECT_NE(err(test::safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "12345678"))
                .find("bad dimension -2"),
            std::string::npos);
  std::string deep = "{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
  EXPECT_NE(err(test::safetensors_bytes(deep, "")).find("nested deeper than 64 levels"), std::string::npos);
}

TEST(HostileSafetensors, IndexIsValidatedBeforeAnyShardIsOpened) {
  auto err = [](const std::string& text) {
    return error_of([&] { parse_safetensors_index(text, "m.safetensors.index.json"); });
  };
  EXPECT_NE(err(R"({"weight_map":{}})").find("weight_map is empty"), std::string::npos);
  EXPECT_NE(err(R"({"weight_map":{"w":"../../etc/passwd"}})").find("expected a file name in the same folder"),
            std::string::npos);
  EXPECT_NE(err(R"({"weight_map":{"w":7}})").find("is not a file name"), std::string::npos);
  EXPECT_NE(err("[" + std::string(100000, '[') + std::string(100000, ']') + "]").find("nested deeper"),
            std::string::npos);
  EXPECT_EQ(parse_safetensors_index(R"({"weight_map":{"b":"s2","a":"s1"}})", "i").size(), 2u);
}
