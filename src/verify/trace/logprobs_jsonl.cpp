#include "verify/trace/logprobs_jsonl.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "verify/trace/logprob_reply.h"

namespace arbiter::verify {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The member at key of j, or null when j is no object or has no such key.
const ReplyJson& member(const ReplyJson& j, const char* key) {
  static const ReplyJson null;
  return j.is_object() && j.contains(key) ? j[key] : null;
}

// How many exact top entries s carries: vLLM's ranked lists are exact; OpenAI's may end with
// the prompt token itself when it ranked below the top N ("up to logprobs + 1"), and such an
// entry is not the (N+1)-th most likely token, so a list ending with the target counts one
// less (when the target truly was N-th this gives up one entry, never a wrong one).
size_t exact_top(const ScoredToken& s) {
  if (s.exact || s.top.empty()) return s.top.size();
  return s.top.size() - (s.top.back().first == s.token ? 1 : 0);
}

}  // namespace

bool is_logprobs_jsonl_file(const std::string& path) {
  if (ends_with(path, ".jsonl")) return true;
  try {
    InputFile f(path, "[trace]");
    char buf[256];
    const size_t n = size_t(std::min<uint64_t>(f.size(), sizeof buf));
    f.read_at(0, buf, n);
    const std::string_view head(buf, n);
    const size_t i = head.find_first_not_of(" \t\r\n");
    return i != std::string_view::npos && head[i] == '{';
  } catch (const Error&) {
    return false;
  }
}

Trace read_logprobs_jsonl(const std::string& path, const LogprobsJsonlOptions& opt) {
  return parse_logprobs_jsonl(read_input_file(path, "[trace]", kMaxInputBytes, "a logprobs dump"), path, opt);
}

Trace parse_logprobs_jsonl(const std::string& data, const std::string& path, const LogprobsJsonlOptions& opt) {
  ARB_CHECK(opt.window >= 0, "[trace] %s: window %lld must be >= 0", path.c_str(), (long long)opt.window);
  ARB_CHECK(!data.empty(), "[trace] %s:1: empty file", path.c_str());
  Trace t;
  t.path = path;
  t.format = TraceFormat::LogprobsJsonl;
  t.has_abs_pos = false;  // a reply says nothing of where in a corpus its prompt came from
  ReplyTokens names(opt.tokenizer);
  std::string shape, api_model;
  std::vector<ScoredToken> scored;  // every row's, in file order
  std::vector<size_t> row_line;     // the line each came from
  size_t k = SIZE_MAX, k_line = 0;
  size_t line = 0, begin = 0;
  while (begin < data.size()) {
    ++line;
    size_t end = data.find('\n', begin);
    ARB_CHECK(end != std::string::npos, "[trace] %s:%zu: last line has no newline: the file is truncated",
              path.c_str(), line);
    std::string_view text(data.data() + begin, end - begin);
    begin = end + 1;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    const std::string where = "[trace] " + path + ":" + std::to_string(line);
    ARB_CHECK(!text.empty(), "%s: empty line", where.c_str());
    const ReplyJson j = parse_json_bounded<ReplyJson>(text, path + ":" + std::to_string(line), "[trace]");
    const ReplyJson& choices = member(j, "choices");
    ARB_CHECK(choices.is_array() && choices.size() == 1,
              "%s: expected a completions reply with one choice (one prompt, n = 1), got %s", where.c_str(),
              choices.is_array() ? strformat("%zu choices", choices.size()).c_str() : "no 'choices' list");
    const ReplyJson& ch = choices[0];
    // Which shape, and how many of the scored tokens are the prompt's.
    const ReplyJson& pl = member(ch, "prompt_logprobs");
    const ReplyJson& lp = member(ch, "logprobs");
    const std::string this_shape = pl.is_array() ? "vllm_prompt_logprobs" : "openai_echo";
    size_t n_prompt = 0;
    if (pl.is_array()) {
      n_prompt = pl.size();
    } else {
      ARB_CHECK(lp.is_object(), "%s: choices[0] has neither prompt_logprobs (vLLM) nor logprobs (OpenAI echo)",
                where.c_str());
      // Echo lists the prompt's tokens and then the generated ones; usage says where they part.
      const ReplyJson& pt = member(member(j, "usage"), "prompt_tokens");
      ARB_CHECK(pt.is_number_unsigned(),
                "%s: no usage.prompt_tokens, so the prompt's tokens cannot be told from generated ones", where.c_str());
      n_prompt = pt.get<size_t>();
    }
    if (shape.empty()) {
      shape = this_shape;
      if (member(j, "model").is_string()) api_model = j["model"].get<std::string>();
    }
    ARB_CHECK(this_shape == shape, "%s: a %s reply after %s ones: one dump holds one shape", where.c_str(),
              this_shape.c_str(), shape.c_str());
    ARB_CHECK(n_prompt >= 2, "%s: a prompt of %zu tokens scores no position", where.c_str(), n_prompt);
    const size_t W = opt.window > 0 ? size_t(opt.window) : n_prompt - 1;
    ARB_CHECK(W <= n_prompt - 1, "%s: the prompt scores %zu positions, fewer than the window %zu", where.c_str(),
              n_prompt - 1, W);
    const size_t from = n_prompt - W;
    std::vector<ScoredToken> s;
    if (pl.is_array()) {
      const ReplyJson& ids = member(ch, "prompt_token_ids").is_array() ? ch["prompt_token_ids"]
                                                                       : member(j, "prompt_token_ids");
      s = vllm_scored(pl, ids, from, W, where);
    } else {
      s = echo_scored(lp, from, W, names, where);
    }
    for (size_t p = 0; p < s.size(); ++p) {
      ARB_CHECK(s[p].token >= 0, "%s: choices[0].logprobs has no tokens list, so the targets are unknown",
                where.c_str());
      std::vector<int32_t> ids;
      for (const auto& e : s[p].top) ids.push_back(e.first);
      std::sort(ids.begin(), ids.end());
      ARB_CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end(),
                "%s prompt token %zu: the top logprobs name one token twice", where.c_str(), from + p);
      if (exact_top(s[p]) < k) {
        k = exact_top(s[p]);
        k_line = line;
      }
      row_line.push_back(line);
      scored.push_back(std::move(s[p]));
    }
  }
  ARB_CHECK(k >= 1 && k != SIZE_MAX, "[trace] %s:%zu: no top logprobs beyond the prompt token itself (request "
            "logprobs >= 1)", path.c_str(), k == SIZE_MAX ? line : k_line);
  // Rows: chunk = the line's index, pos within its window.
  size_t chunk = 0, pos = 0;
  for (size_t r = 0; r < scored.size(); ++r) {
    if (r > 0 && row_line[r] != row_line[r - 1]) {
      ++chunk;
      pos = 0;
    }
    t.rows.push_back(logprob_row(int(chunk), int(pos++), -1, scored[r], int(k)));
  }
  TraceHeader& h = t.header;
  h.topk = int64_t(k);
  if (opt.window > 0) h.chunk_tokens = opt.window;
  h.extra.emplace_back("logits", "logprobs");
  h.extra.emplace_back("logprobs_jsonl",
                       strformat("shape\t%s\tlines\t%zu\twindow\t%s\ttoken_ids\t%s\tmodel\t%s", shape.c_str(), line,
                                 opt.window > 0 ? strformat("%lld (%s)", (long long)opt.window,
                                                            opt.window_source.c_str()).c_str()
                                                : "every scored prompt position",
                                 names.provenance().c_str(), api_model.empty() ? "unknown" : api_model.c_str()));
  return t;
}

}  // namespace arbiter::verify
