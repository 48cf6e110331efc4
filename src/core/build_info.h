#pragma once
// The build's identity, recorded in trace headers, store metadata, gate records and bench
// results. Defined in a source generated at configure time (build_info.cpp.in) so that a new
// commit recompiles one file instead of the whole library.
#include <string>

namespace arbiter {
extern const char* const kVersion;    // project version, e.g. "0.1.0"
extern const char* const kGitCommit;  // short commit hash, or "unknown" outside a git checkout
/// "gcc-<__VERSION__>" with spaces as '-' (one TAB-free field of the trace's `# build` line).
std::string build_compiler();
}  // namespace arbiter
