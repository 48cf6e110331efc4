// Helpers shared by the test suites: paths to shipped models and fixtures, temp dirs,
// running the CLI.
#pragma once
#include <string>

namespace arbiter::test {

/// <repo>/rel
std::string source_path(const std::string& rel);
/// <repo>/../shared/rel, or "" when ../shared is absent (callers GTEST_SKIP with a reason).
std::string shared_path(const std::string& rel);
/// A fresh empty directory under the build's temp area, removed at process exit.
std::string temp_dir(const std::string& tag);
/// Runs the arbiter CLI with args (a shell-quoted string); captures stdout and stderr.
struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
CliResult run_cli(const std::string& args);
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);

}  // namespace arbiter::test
