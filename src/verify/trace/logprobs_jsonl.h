// Saved completions replies with prompt log-probabilities, read as one side of a compare:
// a JSON-lines file, one reply per line, each line one chunk (docs/traces.md §4). Both
// shapes of logprob_reply.h are read: OpenAI's echo + logprobs and vLLM's prompt_logprobs.
// The rows are what `trace --endpoint` would have written from the same replies (the same
// conversion code): log-probabilities with lse 0, so compare judges both sides as
// log-probabilities and says which statistics that leaves valid.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"
#include "verify/trace/trace.h"

namespace arbiter::verify {

struct LogprobsJsonlOptions {
  /// W: each line's traced window is its last W prompt positions (a chunk's context comes
  /// first, as `trace --endpoint` sends it); 0: every scored prompt position (all but the
  /// first token).
  int64_t window = 0;
  std::string window_source;  // how W was chosen, for the header and report ("--window", ...)
  /// Maps plain token text to ids; nullptr: the replies must name tokens by id
  /// ("token_id:N" or vLLM's keys), else the file is refused.
  const Tokenizer* tokenizer = nullptr;
};

/// Whether PATH is to be read as a logprobs dump: its name ends in ".jsonl", or its first
/// byte other than white space is '{' (a trace starts with '#', a row or loader text).
/// False for a file that cannot be opened (read_trace then reports why).
bool is_logprobs_jsonl_file(const std::string& path);

/// Reads the dump (through read_input_file). Rows: chunk = line index from 0, pos 0..W-1,
/// abs_pos unknown, target_logit = the target's log-probability, lse 0, nll = -logprob, and
/// the top K log-probabilities, K the largest that every line provides exactly (the
/// server's own token appended below its top N is not counted). Throws arbiter::Error
/// "[trace] PATH:LINE: what" on a malformed line, a line of another shape than the first, a
/// reply with other than one choice, a window longer than a line's prompt, or token text
/// without a tokenizer.
Trace read_logprobs_jsonl(const std::string& path, const LogprobsJsonlOptions& opt);
/// The same over the file's bytes (path names it in messages).
Trace parse_logprobs_jsonl(const std::string& data, const std::string& path, const LogprobsJsonlOptions& opt);

}  // namespace arbiter::verify
