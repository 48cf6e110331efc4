// Where a trace was made: extra `# host`, `# cpu` and `# driver` header lines (the trace
// format keeps unknown keys, docs/traces.md), read back by the store's METADATA.txt and
// the matrix report's environment table. Written by `arbiter trace` and `arbiter matrix run`.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace arbiter::verify {

/// {"host", hostname}, {"cpu", model name from /proc/cpuinfo}, and {"driver", NVIDIA kernel
/// module version} when /proc/driver/nvidia/version exists. Values never hold a TAB.
std::vector<std::pair<std::string, std::string>> host_header_lines();

/// The driver version in the text after "NVRM version:" of /proc/driver/nvidia/version
/// ("NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." -> "580.159.04"):
/// the first word made of digits and dots. "" when there is none.
std::string nvidia_driver_version(const std::string& nvrm);

}  // namespace arbiter::verify
