#include "verify/trace/logprob_reply.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "io/json.h"

namespace arbiter::verify {

namespace {

// A decimal token id, the whole of s; -1 when s is not one.
int64_t parse_id(std::string_view s) {
  int64_t v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < 0 || v > INT32_MAX) return -1;
  return v;
}

void sort_top(TopList& t) {
  std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
}

// JSON has no NaN or infinity, so a logprob that is not a finite number is a malformed reply.
double logprob_of(const ReplyJson& v, const std::string& where) {
  ARB_CHECK(v.is_number(), "%s: logprob %s is not a number", where.c_str(),
            v.dump(-1, ' ', false, ReplyJson::error_handler_t::replace).substr(0, 60).c_str());
  return v.get<double>();
}

}  // namespace

int32_t ReplyTokens::id(const std::string& name, const std::string& where) {
  if (name.rfind("token_id:", 0) == 0) {
    const int64_t v = parse_id(std::string_view(name).substr(9));
    ARB_CHECK(v >= 0, "%s: token name '%s' is not token_id:<id>", where.c_str(), name.c_str());
    return int32_t(v);
  }
  ARB_CHECK(tok_, "%s: token '%s' is text, not an id: give --tokenizer MODEL to map token text to ids (or dump "
            "with return_tokens_as_token_ids)", where.c_str(), name.c_str());
  if (text_.empty())
    for (int32_t v = 0; v < tok_->vocab_size(); ++v) {
      auto [it, fresh] = text_.emplace(tok_->token_bytes(v), std::pair{v, 0});
      ++it->second.second;
    }
  auto it = text_.find(name);
  ARB_CHECK(it != text_.end(), "%s: token text '%s' is in no entry of the tokenizer's vocabulary", where.c_str(),
            name.c_str());
  mapped_ = true;
  ambiguous_ += it->second.second > 1;
  return it->second.first;
}

TopList ReplyTokens::top_list(const ReplyJson& top, const std::string& where) {
  TopList out;
  if (top.is_object()) {
    for (const auto& [key, v] : top.items()) out.emplace_back(id(key, where), logprob_of(v, where));
  } else if (top.is_array()) {
    for (const ReplyJson& e : top) {
      ARB_CHECK(e.is_object() && e.contains("logprob"), "%s: a top logprobs entry without 'logprob'", where.c_str());
      int32_t i;
      if (e.contains("id") && e["id"].is_number_integer()) {
        const int64_t v = parse_id(e["id"].dump());
        ARB_CHECK(v >= 0, "%s: top logprobs id %s is not a token id", where.c_str(), e["id"].dump().c_str());
        i = int32_t(v);
      } else {
        ARB_CHECK(e.contains("token") && e["token"].is_string(), "%s: a top logprobs entry without 'id' or 'token'",
                  where.c_str());
        i = id(e["token"].get<std::string>(), where);
      }
      out.emplace_back(i, logprob_of(e["logprob"], where));
    }
  } else {
    throw Error(where + ": top logprobs are neither an object nor a list");
  }
  sort_top(out);
  return out;
}

std::string ReplyTokens::provenance() const {
  return mapped_ ? strformat("mapped from text (%lld ambiguous)", (long long)ambiguous_) : "returned";
}

std::vector<ScoredToken> echo_scored(const ReplyJson& lp, size_t from, size_t n, ReplyTokens& names,
                                     const std::string& where) {
  ARB_CHECK(lp.is_object() && lp.contains("token_logprobs") && lp["token_logprobs"].is_array() &&
                lp.contains("top_logprobs") && lp["top_logprobs"].is_array(),
            "%s: choices[0].logprobs has no token_logprobs and top_logprobs lists (was the request made with echo "
            "and logprobs?)", where.c_str());
  const ReplyJson& tl = lp["token_logprobs"];
  const ReplyJson& top = lp["top_logprobs"];
  const bool named = lp.contains("tokens") && lp["tokens"].is_array();
  ARB_CHECK(tl.size() >= from + n && top.size() >= from + n && (!named || lp["tokens"].size() >= from + n),
            "%s: the reply scores %zu tokens, %zu expected", where.c_str(), std::min(tl.size(), top.size()), from + n);
  std::vector<ScoredToken> out;
  for (size_t i = from; i < from + n; ++i) {
    const std::string at = strformat("%s prompt token %zu", where.c_str(), i);
    ScoredToken s;
    ARB_CHECK(!tl[i].is_null() && !top[i].is_null(), "%s: no logprob (null)", at.c_str());
    s.logprob = logprob_of(tl[i], at);
    if (named) {
      ARB_CHECK(lp["tokens"][i].is_string(), "%s: tokens[%zu] is not a string", at.c_str(), i);
      s.token = names.id(lp["tokens"][i].get<std::string>(), at);
    }
    s.top = names.top_list(top[i], at);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ScoredToken> vllm_scored(const ReplyJson& pl, const ReplyJson& prompt_ids, size_t from, size_t n,
                                     const std::string& where) {
  ARB_CHECK(pl.is_array() && pl.size() >= from + n, "%s: prompt_logprobs scores %zu tokens, %zu expected",
            where.c_str(), pl.is_array() ? pl.size() : size_t(0), from + n);
  const bool have_ids = prompt_ids.is_array();
  ARB_CHECK(!have_ids || prompt_ids.size() == pl.size(), "%s: %zu prompt_token_ids but %zu prompt_logprobs",
            where.c_str(), prompt_ids.size(), pl.size());
  std::vector<ScoredToken> out;
  for (size_t i = from; i < from + n; ++i) {
    const std::string at = strformat("%s prompt token %zu", where.c_str(), i);
    const ReplyJson& d = pl[i];
    ARB_CHECK(d.is_object() && !d.empty(), "%s: no prompt logprobs (null or empty)", at.c_str());
    ScoredToken s;
    struct Entry {
      int32_t id;
      double logprob;
      int64_t rank;  // -1: not given
    };
    std::vector<Entry> entries;
    for (const auto& [key, v] : d.items()) {
      const int64_t k = parse_id(key);
      ARB_CHECK(k >= 0, "%s: key '%s' is not a token id", at.c_str(), key.c_str());
      ARB_CHECK(v.is_object() && v.contains("logprob"), "%s: entry '%s' has no logprob", at.c_str(), key.c_str());
      const int64_t rank = v.contains("rank") && v["rank"].is_number_integer() ? v["rank"].get<int64_t>() : -1;
      entries.push_back({int32_t(k), logprob_of(v["logprob"], at), rank});
    }
    if (have_ids) {
      ARB_CHECK(prompt_ids[i].is_number_integer() && parse_id(prompt_ids[i].dump()) >= 0,
                "%s: prompt_token_ids[%zu] is not a token id", at.c_str(), i);
      s.token = prompt_ids[i].get<int32_t>();
    } else {
      s.token = entries[0].id;  // vLLM lists the prompt token first
    }
    auto target = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.id == s.token; });
    ARB_CHECK(target != entries.end(), "%s: the prompt token %d has no entry", at.c_str(), s.token);
    s.logprob = target->logprob;
    // With ranks, the entries ranked 1, 2, ..., m are the model's exact top m; the prompt
    // token, when it ranked lower, is left out of the list (it is the target, not a top entry).
    s.exact = std::all_of(entries.begin(), entries.end(), [](const Entry& e) { return e.rank >= 1; });
    if (s.exact) std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.rank < b.rank; });
    for (size_t j = 0; j < entries.size() && (!s.exact || entries[j].rank == int64_t(j) + 1); ++j)
      s.top.emplace_back(entries[j].id, entries[j].logprob);
    sort_top(s.top);
    out.push_back(std::move(s));
  }
  return out;
}

TraceRow logprob_row(int chunk, int pos, int64_t abs_pos, const ScoredToken& s, int K) {
  ARB_ASSERT(K >= 1 && s.top.size() >= size_t(K));
  TraceRow r;
  r.chunk = chunk;
  r.pos = pos;
  r.abs_pos = abs_pos;
  r.target = s.token;
  r.target_logit = s.logprob;
  r.lse = 0;
  r.nll = -s.logprob;
  for (int k = 0; k < K; ++k) {
    r.top_ids.push_back(s.top[size_t(k)].first);
    r.top_logits.push_back(s.top[size_t(k)].second);
  }
  return r;
}

}  // namespace arbiter::verify
