#include "verify/trace/api_trace.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "io/file.h"
#include "io/json.h"
#include "verify/trace/logprob_reply.h"

namespace arbiter::verify {

using json = ReplyJson;  // replies keep their key order (logprob_reply.h)

namespace {

struct Url {
  std::string origin;  // scheme://host:port
  std::string path;    // of the completions endpoint
};

Url parse_endpoint(const std::string& ep) {
  const size_t scheme = ep.find("://");
  ARB_CHECK(scheme != std::string::npos && (ep.rfind("http://", 0) == 0 || ep.rfind("https://", 0) == 0),
            "[api] --endpoint '%s': expected http://HOST:PORT[/v1]", ep.c_str());
  const size_t slash = ep.find('/', scheme + 3);
  Url u;
  u.origin = ep.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : ep.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() < 3 || prefix.compare(prefix.size() - 3, 3, "/v1") != 0) prefix += "/v1";
  u.path = prefix + "/completions";
  return u;
}

}  // namespace

bool holds_logprobs(const Trace& t) {
  for (const auto& [k, v] : t.header.extra)
    if (k == "logits" && v == "logprobs") return true;
  return false;
}

Trace as_logprobs(const Trace& t) {
  if (holds_logprobs(t)) return t;
  ARB_CHECK(t.has_lse, "[compare] %s: no lse, so its logits cannot be made log-probabilities to compare "
            "with an API trace", t.path.c_str());
  Trace o = t;
  for (TraceRow& r : o.rows) {
    r.target_logit -= r.lse;
    for (double& l : r.top_logits) l -= r.lse;
    r.lse = 0;
  }
  o.header.extra.emplace_back("logits", "logprobs");
  return o;
}

TraceRunResult run_api_trace(const Model& m, const ApiTraceOptions& opt) {
  const TraceRunOptions& to = opt.trace;
  const TraceShape& sh = to.shape;
  const int W = sh.chunk_tokens, C = sh.max_chunks, P = sh.prefill, K = to.topk;
  ARB_CHECK(W >= 1 && C >= 1 && P >= 0 && K >= 1, "[api] bad shape or --topk");
  ARB_CHECK(to.full_logits_path.empty(), "[api] --full-logits: an API gives no full logits");
  const Url url = parse_endpoint(opt.endpoint);
  check_output_target(to.out_path, "[api]");
  const TraceCorpus tc = load_trace_corpus(to, m);  // context and length checked
  const std::string& text = tc.text;
  const std::vector<int32_t>& corpus = tc.tokens;
  const int32_t bos = m.tokenizer->bos_id();

  TraceHeader h = trace_header_for(m, to, text, int64_t(corpus.size()));
  h.device = "api:" + opt.endpoint;
  h.compute = opt.compute;  // the engine behind an API does not say; the user may
  h.weights = "";
  h.providers = "";
  h.fallbacks = -1;
  h.inject = "none";
  h.extra.emplace_back("logits", "logprobs");
  h.extra.emplace_back("api", "endpoint\t" + opt.endpoint + "\tmodel\t" + opt.api_model + "\tmode\t" + opt.mode);

  httplib::Client cli(url.origin);
  const auto secs = std::chrono::duration<double>(opt.timeout_s);
  cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
  cli.set_write_timeout(std::chrono::seconds(60));
  cli.set_connection_timeout(std::chrono::seconds(10));
  httplib::Headers headers;
  if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);

  ReplyTokens names(m.tokenizer.get());  // the endpoint's token names -> ids
  auto post = [&](const json& req, const std::string& where) {
    auto res = cli.Post(url.path, headers, req.dump(), "application/json");
    ARB_CHECK(res, "%s: no answer (%s)", where.c_str(), httplib::to_string(res.error()).c_str());
    if (res->status != 200) {
      std::string msg = res->body.substr(0, 400);
      try {
        msg = parse_json_bounded<json>(res->body, where, "[api]").at("error").at("message").get<std::string>();
      } catch (...) {
      }
      throw Error(strformat("%s: HTTP %d: %s", where.c_str(), res->status, msg.c_str()));
    }
    const json reply = parse_json_bounded<json>(res->body, where + " reply", "[api]");
    try {
      return reply.at("choices").at(0).at("logprobs");
    } catch (const json::exception& e) {
      throw Error(strformat("%s: reply has no choices[0].logprobs (%s)", where.c_str(), e.what()));
    }
  };
  const bool next_mode = opt.mode == "next";
  ARB_CHECK(next_mode || opt.mode == "echo", "[api] --api-mode '%s': expected echo or next", opt.mode.c_str());
  const int ask = std::max(K, opt.top);  // how many top logprobs each request asks for
  std::vector<TraceRow> rows;
  Progress meter(to.progress_tag == "trace" ? "api" : to.progress_tag, C, "chunks", Progress::Unit::Count, to.progress);
  for (int c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(sh, c);
    std::vector<int32_t> ids;
    if (bos >= 0) ids.push_back(bos);
    ids.insert(ids.end(), corpus.begin() + (b - P), corpus.begin() + b + W + 1);
    const size_t first = ids.size() - size_t(W);  // prompt index of the chunk's first target
    // echo: the whole chunk in one request, its prompt tokens scored. next: one request per
    // position, the prefix before the target, the next token's distribution. max_tokens 1,
    // not 0: some servers refuse 0; the generated token is ignored.
    json lp;
    if (!next_mode) {
      const std::string where = strformat("[api] %s chunk %d", opt.endpoint.c_str(), c);
      lp = post({{"model", opt.api_model}, {"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true},
                 {"logprobs", ask}, {"return_tokens_as_token_ids", true}}, where);
      ARB_CHECK(lp.is_object() && lp.contains("token_logprobs") && lp["token_logprobs"].is_array() &&
                    lp["token_logprobs"].size() >= ids.size() && lp["top_logprobs"].is_array(),
                "%s: the reply scores no prompt tokens (the server does not support echo: use --api-mode next)",
                where.c_str());
    }
    for (int p = 0; p < W; ++p) {
      const size_t i = first + size_t(p);
      const std::string where = strformat("[api] %s chunk %d pos %d", opt.endpoint.c_str(), c, p);
      ScoredToken s;
      if (!next_mode) {
        s = std::move(echo_scored(lp, i, 1, names, where)[0]);
        // Text names map back to one of the ids sharing a text, so only ids can be checked.
        ARB_CHECK(s.token < 0 || s.token == ids[i] || names.mapped_from_text(),
                  "%s: the server echoed token %d where %d was sent (did it re-tokenize?)", where.c_str(), s.token,
                  ids[i]);
      } else {
        const std::vector<int32_t> prefix(ids.begin(), ids.begin() + long(i));
        const json r = post({{"model", opt.api_model}, {"prompt", prefix}, {"max_tokens", 1}, {"temperature", 0},
                             {"logprobs", ask}, {"return_tokens_as_token_ids", true}}, where);
        // completions shape: top_logprobs[0]; llama.cpp's: content[0].top_logprobs
        const json* top = nullptr;
        if (r.contains("top_logprobs") && r["top_logprobs"].is_array() && !r["top_logprobs"].empty())
          top = &r["top_logprobs"][0];
        else if (r.contains("content") && r["content"].is_array() && !r["content"].empty() &&
                 r["content"][0].contains("top_logprobs"))
          top = &r["content"][0]["top_logprobs"];
        ARB_CHECK(top, "%s: the reply has no top logprobs for the next token", where.c_str());
        s.top = names.top_list(*top, where);
        auto hit = std::find_if(s.top.begin(), s.top.end(), [&](const auto& e) { return e.first == ids[i]; });
        ARB_CHECK(hit != s.top.end(),
                  "%s: target %d is not among the %zu top logprobs returned (ask for more with --api-top)",
                  where.c_str(), ids[i], s.top.size());
        s.logprob = hit->second;
      }
      ARB_CHECK(int(s.top.size()) >= K, "%s: the server returned %zu top logprobs, --topk is %d", where.c_str(),
                s.top.size(), K);
      s.token = ids[i];
      rows.push_back(logprob_row(c, p, b + p + 1, s, K));
    }
    meter.update(c + 1);
  }
  meter.finish();
  h.extra.emplace_back("api_limits", strformat("lse\tunknown (rows hold log-probabilities, lse 0)\ttopk\t%d of the API's "
                                               "top logprobs\tcompute\t%s\ttoken_ids\t%s",
                                               K, opt.compute.empty() ? "unknown" : "stated by the user", names.provenance().c_str()));
  TraceRunResult res;
  res.elapsed_s = meter.elapsed_s();
  TraceWriter w;
  w.open(to.out_path, h);
  for (const TraceRow& r : rows) w.write_row(r);
  w.finish(res.elapsed_s);
  res.rows = w.rows();
  res.nonfinite = w.nonfinite_values();
  return res;
}

}  // namespace arbiter::verify
