// Completions replies with prompt log-probabilities turned into trace rows. Shared by the two
// ways such replies reach arbiter: live from an endpoint (`trace --endpoint`, api_trace.cpp)
// and saved as JSON lines (logprobs_jsonl.cpp), so that both read a reply the same way.
//
// Two reply shapes (docs/traces.md §4):
//   - OpenAI completions with `echo: true, logprobs: N`: choices[0].logprobs holds, per
//     prompt (then generated) token, `tokens[i]`, `token_logprobs[i]` (null for the first),
//     `top_logprobs[i]` ({name: logprob}, null for the first) and `text_offset[i]`;
//   - vLLM's `prompt_logprobs: N`: choices[0].prompt_logprobs, per prompt token null (the
//     first) or {"<id>": {logprob, rank, decoded_token}}, the prompt token listed first.
// Token names are "token_id:N" (`return_tokens_as_token_ids`), or text, mapped back to ids
// through a tokenizer.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "verify/trace/trace.h"

namespace arbiter::verify {

/// Replies keep their key order: vLLM lists the prompt token first in each prompt_logprobs
/// dict, and that is how its target is known when the reply has no prompt_token_ids.
using ReplyJson = nlohmann::ordered_json;

/// (token id, log-probability), descending by log-probability, ties to the lower id.
using TopList = std::vector<std::pair<int32_t, double>>;

/// Maps a reply's token names to ids and counts how they were known.
class ReplyTokens {
 public:
  /// tok maps plain token text to ids (the first id of a text wins); nullptr: only ids are
  /// understood ("token_id:N", vLLM's numeric keys, llama.cpp's "id") and text is refused.
  explicit ReplyTokens(const Tokenizer* tok) : tok_(tok) {}
  /// The id of one token name. Throws arbiter::Error "WHERE: ..." for a malformed
  /// "token_id:" name, for text without a tokenizer, or for text not in its vocabulary.
  int32_t id(const std::string& name, const std::string& where);
  /// A top list: a completions-shape object {name: logprob}, or llama.cpp's array of
  /// {id | token, logprob}. Entries whose logprob is not a number are refused.
  TopList top_list(const ReplyJson& top, const std::string& where);
  /// "returned" when every name was an id, else "mapped from text (N ambiguous)": N texts
  /// that more than one id shares, where the mapping took the lowest id.
  std::string provenance() const;
  bool mapped_from_text() const { return mapped_; }

 private:
  const Tokenizer* tok_;
  std::map<std::string, std::pair<int32_t, int>> text_;  // text -> (lowest id, ids sharing it)
  bool mapped_ = false;
  int64_t ambiguous_ = 0;
};

/// One scored prompt position: the token there, its log-probability given the tokens before
/// it, and the reply's top list. exact: the list is known to be the model's exact top-|list|
/// (vLLM ranks 1..m); otherwise it is the server's top N, possibly with the token itself
/// appended when it ranked below them (OpenAI's "up to logprobs + 1").
struct ScoredToken {
  int32_t token = -1;  // -1: the reply does not name it (no `tokens` array)
  double logprob = 0;
  TopList top;
  bool exact = false;
};

/// Prompt positions [from, from + n) of an echo reply's choices[0].logprobs. Throws
/// arbiter::Error "WHERE: ..." when the arrays are missing or short, or a position has no
/// numeric logprob or no top list.
std::vector<ScoredToken> echo_scored(const ReplyJson& logprobs, size_t from, size_t n, ReplyTokens& names,
                                     const std::string& where);

/// Prompt positions [from, from + n) of a vLLM choices[0].prompt_logprobs list. prompt_ids:
/// the reply's prompt_token_ids, or null (the target is then each dict's first key). Keys
/// are ids, so no tokenizer is needed.
std::vector<ScoredToken> vllm_scored(const ReplyJson& prompt_logprobs, const ReplyJson& prompt_ids, size_t from,
                                     size_t n, const std::string& where);

/// A trace row of log-probabilities: target_logit = logprob, lse 0, nll = -logprob, and the
/// first K entries of s.top (the caller checks that s.top holds K).
TraceRow logprob_row(int chunk, int pos, int64_t abs_pos, const ScoredToken& s, int K);

}  // namespace arbiter::verify
