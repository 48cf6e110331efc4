// What `matrix report` reads from a run directory besides the traces themselves: the run's
// status file, A/A row identity, and the providers line of a trace header.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace arbiter::verify {

/// DIR/run-status.tsv: trace file name -> (state, detail). Missing file: empty.
std::map<std::string, std::pair<std::string, std::string>> read_status(const std::string& dir);
/// The data rows of an arbiter trace's text: from the line after `# columns` to `# end`.
std::string data_rows(const std::string& text);
/// A/A: are the two traces' rows byte-identical? detail names the first differing row.
bool rows_identical(const std::string& a_path, const std::string& b_path, std::string& detail);
/// A `# providers` field, "op=provider:calls,...", as op -> provider -> calls.
std::map<std::string, std::map<std::string, int64_t>> parse_providers(const std::string& s);
/// Does a provider's tier prefix ("cpu." in "cpu.gemv_bf16") belong to the device that ran it?
bool provider_of_device(const std::string& provider, const std::string& device);

}  // namespace arbiter::verify
