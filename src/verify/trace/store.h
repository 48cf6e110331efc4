// Evidence on disk (DESIGN.md §5): a trace directory holding traces (and their optional
// `.logits` side files) plus METADATA.txt, RUNS.txt and SHA256SUMS (`sha256sum -c`).
// Every file is written to a hidden temporary name and renamed, so a crash never leaves a
// half-written file under a real name.
#pragma once
#include <string>
#include <vector>

#include "verify/judge/compare.h"

namespace arbiter::verify {

/// Reserved file names of a store directory.
constexpr const char* kStoreMetadata = "METADATA.txt";
constexpr const char* kStoreRuns = "RUNS.txt";
constexpr const char* kStoreSums = "SHA256SUMS";

/// Copies each trace (an arbiter trace, complete) and its PATH.logits file when present into
/// dir (created if absent), then rewrites METADATA.txt, RUNS.txt and SHA256SUMS over every
/// trace in dir. A name already in dir must hold identical bytes. Throws arbiter::Error.
void store_add(const std::string& dir, const std::vector<std::string>& traces);

/// The traces of a store directory (file names, sorted): every regular file except the
/// reserved names, `*.logits` and hidden files.
std::vector<std::string> store_trace_names(const std::string& dir);

/// Checks a store: SHA256SUMS lists every file and each checksum matches; every trace reads
/// as a complete arbiter trace whose rows fit its shape; RUNS.txt agrees; logits files match
/// their traces. Returns one message per problem, each naming the file; empty = sound.
/// progress: bytes hashed on stderr (core/progress.h).
std::vector<std::string> store_verify(const std::string& dir, bool progress = false);

/// Writes dir/SHA256SUMS over every file of dir except itself, hidden files and AtomicFile
/// temporaries (`sha256sum -c` format). Shared with other evidence directories (gate records).
void write_sha256sums(const std::string& dir, const std::string& component);

/// The checksum half of store_verify: SHA256SUMS present and well-formed, every listed file
/// present with a matching checksum, every file listed, no stray hidden or temporary file.
/// One message per problem, each "DIR/NAME: what"; empty = sound. dir must be a directory.
/// progress: bytes hashed on stderr (core/progress.h).
std::vector<std::string> check_sha256sums(const std::string& dir, bool progress = false);

/// One compared pair of `store compare`.
struct StorePair {
  std::string shape, model_sha256, ref_name, cand_name;
  Verdict verdict = Verdict::Unreadable;
  std::string error;      // set when a file could not be read (verdict unreadable)
  CompareResult result;   // valid when error is empty
};

struct StoreComparison {
  std::vector<StorePair> pairs;
  std::vector<std::string> unpaired;  // traces with no partner of the same shape + model
  std::vector<std::string> problems;  // store_verify problems of either directory
  Verdict worst = Verdict::Pass;
};

/// Pairs ref and cand traces by (shape name, model sha256) and compares every pair with opt
/// (full logits used when both `.logits` files exist, unless topk_only). Unpaired traces
/// count as inconclusive; a directory that fails store_verify makes the result unreadable
/// and no pair is compared.
StoreComparison store_compare(const std::string& ref_dir, const std::string& cand_dir,
                              const CompareOptions& opt, bool topk_only);

/// The summary table of a StoreComparison, one line per pair.
std::string format_store_comparison(const StoreComparison& c);
nlohmann::json to_json(const StoreComparison& c);

}  // namespace arbiter::verify
