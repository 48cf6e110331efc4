// arbiter: one CLI, many subcommands (each in cmd_<name>.cpp). Errors from the library
// arrive as arbiter::Error and are printed as one line; the exit code is then 1 unless the
// subcommand defines its own (compare: 4 for unreadable input).
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/build_info.h"
#include "cli/command.h"
#include "core/error.h"

using namespace arbiter;

static void usage() {
  std::fprintf(stderr, "usage: arbiter <command> [options]   (arbiter <command> --help)\n\ncommands:\n");
  for (const auto& [name, c] : cli::commands())
    std::fprintf(stderr, "  %-10s %s\n", name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("arbiter %s (%s)\n", kVersion, kGitCommit);
    return 0;
  }
  auto it = cli::commands().find(argv[1]);
  if (it == cli::commands().end()) {
    std::fprintf(stderr, "arbiter: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
  }
  try {
    return it->second.fn(argc - 2, argv + 2);
  } catch (const Error& e) {
    std::fprintf(stderr, "arbiter %s: %s\n", argv[1], e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arbiter %s: %s\n", argv[1], describe_failure(e).c_str());
    return 1;
  }
}
