// core/progress.h on a terminal: a child process whose stderr is a pseudo-terminal (raw, so
// the terminal adds no '\r' of its own) must draw one live line with '\r', end it with '\n'
// before a status line, and finish with the final line. The log-file form (no '\r', a line
// every second) is checked through the real binary in tests/e2e/progress_cli_test.cpp.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/progress.h"

using namespace arbiter;

TEST(Progress, LiveLineOnATerminal) {
  termios raw{};
  cfmakeraw(&raw);
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, &raw, nullptr);
  ASSERT_GE(pid, 0) << "forkpty: " << std::strerror(errno);
  if (pid == 0) {
    // 100 updates over ~0.4 s: several redraws at the terminal's 0.1 s pace.
    Progress p("t", 100, "items");
    for (int i = 1; i <= 50; ++i) p.update(i), ::usleep(4000);
    progress_note("t", "a note");
    for (int i = 51; i <= 100; ++i) p.update(i), ::usleep(4000);
    p.finish();
    ::_exit(progress_is_tty() ? 0 : 3);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EIO once the child has closed the terminal
    out.append(buf, size_t(n));
  }
  ::close(master);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the child did not see a terminal\n" << out;
  EXPECT_NE(out.find("\r[t] "), std::string::npos) << out;
  EXPECT_NE(out.find(" / 100 items ("), std::string::npos) << out;
  // The live line is ended before the note, so the note starts a line of its own.
  EXPECT_NE(out.find("\n[t] a note\n"), std::string::npos) << out;
  // The final line overwrites the live one and ends the output.
  const std::string last = "[t] done 100 items in ";
  ASSERT_NE(out.rfind("\r" + last), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n') << out;
}
