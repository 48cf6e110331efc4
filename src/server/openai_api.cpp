// POST /v1/completions and /v1/chat/completions: the request parsed and checked
// (server/requests.h), one sequence submitted per prompt and choice, and the answer as JSON
// or as server-sent events ending in `data: [DONE]`.
#include <httplib.h>


#include "core/error.h"
#include "server/server_impl.h"
#include "server/text_stream.h"

namespace arbiter::server {
namespace {

// One choice: a sequence on the engine and the text made of its tokens so far.
struct ChoiceRun {
  int index = 0;
  std::vector<int32_t> prompt;
  std::string prompt_text;  // echo
  std::shared_ptr<SeqStream> seq;
  std::unique_ptr<StopTextStream> text;
  bool finished = false;
  std::string finish;  // "stop" / "length"
  std::string error;
  int generated = 0;
  Clock::time_point last_token;
  // accumulated (non-stream)
  std::string out;
  std::vector<TokenLogprob> tokens, prompt_lp;
};

// What a choice produced since the last update.
struct Update {
  const std::vector<TokenLogprob>* prompt = nullptr;
  std::string delta;
  std::vector<TokenLogprob> tokens;
  bool finished = false;
};

class Generation {
 public:
  Generation(Server::Impl& I, const GenParams& p, Clock::time_point t0) : I_(I), p_(p), t0_(t0) {}

  /// Submits one sequence per prompt x n; 413 when a prompt does not fit, 503 when the queue
  /// is full (nothing stays queued then).
  void submit(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::string>& prompt_texts,
              int prompt_logprobs) {
    const int ctx = I_.sched->max_ctx();
    for (const auto& pr : prompts) {
      if (pr.empty()) bad_request("the prompt is empty (and the model adds no BOS token)", "prompt");
      if (int(pr.size()) >= ctx)
        throw ApiError{413, strformat("the prompt has %zu tokens; this server's context holds %d (prompt and completion)",
                                      pr.size(), ctx), "prompt", "context_length_exceeded"};
    }
    for (size_t pi = 0; pi < prompts.size(); ++pi)
      for (int j = 0; j < p_.n; ++j) {
        ChoiceRun c;
        c.index = int(runs_.size());
        c.prompt = prompts[pi];
        c.prompt_text = prompt_texts[pi];
        c.text = std::make_unique<StopTextStream>(*I_.model->tokenizer, p_.stop);
        SeqRequest r;
        r.prompt = c.prompt;
        r.max_tokens = p_.max_tokens;
        r.sampling = p_.sampling;
        r.sampling.seed = p_.sampling.seed + uint64_t(j);  // choices of one request differ
        r.penalties = p_.penalties;
        r.top_logprobs = p_.top_logprobs;
        r.prompt_logprobs = prompt_logprobs;
        r.stop_ids = I_.model->eos_ids;
        c.seq = I_.sched->submit(std::move(r));
        if (!c.seq) {
          cancel_all();
          throw ApiError{503, "server busy: the request queue is full, retry later", "", ""};
        }
        runs_.push_back(std::move(c));
      }
    int64_t prompt_tokens = 0;
    for (const auto& pr : prompts) prompt_tokens += int64_t(pr.size()) * p_.n;
    I_.metrics.tokens(prompt_tokens, 0);
  }

  void cancel_all() {
    for (auto& c : runs_) c.seq->cancel();
  }

  /// Runs until every choice finished; on_update returns false when the client is gone.
  /// Returns false then (every sequence cancelled).
  bool drive(const std::function<bool(ChoiceRun&, Update&)>& on_update) {
    const auto wait = std::chrono::milliseconds(runs_.size() == 1 ? 50 : 2);
    while (true) {
      bool all = true;
      for (auto& c : runs_) {
        if (c.finished) continue;
        all = false;
        if (I_.stopping) {
          c.finished = true;
          c.error = "the server is shutting down";
          c.seq->cancel();
          continue;
        }
        std::optional<SeqEvent> ev = c.seq->next(wait);
        if (!ev) continue;
        Update u;
        handle(c, *ev, u);
        if ((u.prompt || !u.delta.empty() || !u.tokens.empty() || u.finished) && !on_update(c, u)) {
          cancel_all();
          return false;
        }
      }
      if (all) return true;
    }
  }

  std::vector<ChoiceRun>& runs() { return runs_; }
  json usage() const {
    int64_t pt = 0, ct = 0;
    for (const auto& c : runs_) {
      ct += c.generated;
      pt += int64_t(c.prompt.size());
    }
    return {{"prompt_tokens", pt}, {"completion_tokens", ct}, {"total_tokens", pt + ct}};
  }
  std::string first_error() const {
    for (const auto& c : runs_)
      if (!c.error.empty()) return c.error;
    return "";
  }

 private:
  Server::Impl& I_;
  const GenParams p_;  // a copy: a streamed response outlives the handler's frame
  Clock::time_point t0_;
  std::vector<ChoiceRun> runs_;

  void handle(ChoiceRun& c, SeqEvent& ev, Update& u) {
    if (ev.kind == SeqEvent::Kind::Prompt) {
      c.prompt_lp = std::move(ev.prompt);
      u.prompt = &c.prompt_lp;
      return;
    }
    if (ev.kind == SeqEvent::Kind::Token) {
      const auto now = Clock::now();
      if (c.generated == 0) I_.metrics.time_to_first_token(std::chrono::duration<double>(now - t0_).count());
      else I_.metrics.inter_token_latency(std::chrono::duration<double>(now - c.last_token).count());
      c.last_token = now;
      ++c.generated;
      I_.metrics.tokens(0, 1);
      u.delta = c.text->push(ev.token.id);
      u.tokens.push_back(ev.token);
      if (c.text->stopped()) {
        c.seq->cancel();
        c.finished = u.finished = true;
        c.finish = "stop";
      }
      return;
    }
    c.finished = u.finished = true;
    if (ev.finish == FinishReason::Error) {
      c.error = ev.error;
    } else if (ev.finish == FinishReason::Cancelled) {
      c.error = "the sequence was cancelled";
    } else {
      u.delta = c.text->flush();
      c.finish = finish_reason_name(ev.finish);
    }
  }
};

std::string token_string(const Tokenizer& tok, int32_t id, bool as_ids) {
  return as_ids ? "token_id:" + std::to_string(id) : tok.token_bytes(id);
}

// Completions' logprobs object for tokens, with text offsets counted from `offset`.
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& toks, bool as_ids, size_t& offset,
                         bool first_is_prompt_start, int32_t first_id) {
  json j = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  auto add = [&](int32_t id, const json& lp, const json& top) {
    const std::string s = token_string(tok, id, as_ids);
    j["tokens"].push_back(s);
    j["token_logprobs"].push_back(lp);
    j["top_logprobs"].push_back(top);
    j["text_offset"].push_back(offset);
    offset += s.size();
  };
  if (first_is_prompt_start) add(first_id, nullptr, nullptr);
  for (const TokenLogprob& t : toks) {
    json top = json::object();
    for (const auto& [id, lp] : t.top) {
      const std::string s = token_string(tok, id, as_ids);
      if (!top.contains(s)) top[s] = lp;  // two ids with one text: the likelier one stays
    }
    add(t.id, t.logprob, top);
  }
  return j;
}

json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& toks, bool as_ids) {
  auto entry = [&](int32_t id, double lp) {
    const std::string s = token_string(tok, id, as_ids);
    json bytes = json::array();
    for (unsigned char ch : s) bytes.push_back(int(ch));
    return json{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprob& t : toks) {
    json e = entry(t.id, t.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
    content.push_back(e);
  }
  return {{"content", content}};
}

// Sends events: the provider writes "data: ...\n\n" per chunk and "data: [DONE]".
struct SseSink {
  httplib::DataSink& sink;
  bool write(const json& j) {
    const std::string s = "data: " + dump(j) + "\n\n";
    return sink.write(s.data(), s.size());
  }
  bool done() {
    static const std::string d = "data: [DONE]\n\n";
    bool ok = sink.write(d.data(), d.size());
    sink.done();
    return ok;
  }
};

}  // namespace

RequestLimits Server::Impl::limits() const {
  return RequestLimits{*model->tokenizer, model->config.vocab, sched->max_ctx(), opt.max_logprobs, opt.model_name, tpl};
}

void Server::Impl::completions(const json& b, const httplib::Request&, httplib::Response& res, Clock::time_point t0) {
  const Tokenizer& tok = *model->tokenizer;
  const CompletionRequest r = parse_completion_request(b, limits());
  const GenParams& p = r.p;
  const int logprobs = r.logprobs;
  const bool echo = r.echo;
  const std::string id = "cmpl-" + std::to_string(next_id++);
  const int64_t created = int64_t(std::time(nullptr));
  auto gen = std::make_shared<Generation>(*this, p, t0);
  gen->submit(r.prompts, r.texts, echo && logprobs >= 0 ? std::max(logprobs, 0) : -1);
  const bool as_ids = p.ids_as_strings;

  if (!p.stream) {
    std::vector<size_t> offsets(gen->runs().size(), 0);
    std::vector<json> lps(gen->runs().size(), nullptr);
    gen->drive([&](ChoiceRun& c, Update& u) {
      if (u.prompt && echo)
        lps[size_t(c.index)] = completion_logprobs(tok, *u.prompt, as_ids, offsets[size_t(c.index)], true, c.prompt[0]);
      c.out += u.delta;
      c.tokens.insert(c.tokens.end(), u.tokens.begin(), u.tokens.end());
      return true;
    });
    if (!gen->first_error().empty()) throw ApiError{500, gen->first_error(), "", ""};
    json choices = json::array();
    for (auto& c : gen->runs()) {
      json lp = nullptr;
      if (logprobs >= 0) {
        size_t off = offsets[size_t(c.index)];
        json gen_lp = completion_logprobs(tok, c.tokens, as_ids, off, false, 0);
        if (echo && !lps[size_t(c.index)].is_null()) {
          lp = lps[size_t(c.index)];
          for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
            for (auto& e : gen_lp[k]) lp[k].push_back(e);
        } else {
          lp = gen_lp;
        }
      }
      choices.push_back({{"index", c.index}, {"text", (echo ? c.prompt_text : "") + c.out}, {"logprobs", lp},
                         {"finish_reason", c.finish}});
    }
    res.set_content(dump({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", opt.model_name},
                          {"choices", choices}, {"usage", gen->usage()}}),
                    "application/json");
    return;
  }

  res.set_chunked_content_provider("text/event-stream", [this, gen, p, id, created, logprobs, echo, as_ids,
                                                         &tok](size_t, httplib::DataSink& sink) {
    SseSink sse{sink};
    std::vector<size_t> offsets(gen->runs().size(), 0);
    std::vector<bool> echoed(gen->runs().size(), false);
    auto chunk = [&](const ChoiceRun& c, const std::string& text, const json& lp, const json& finish) {
      return json{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", opt.model_name},
                  {"choices", json::array({{{"index", c.index}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}}})}};
    };
    bool ok = gen->drive([&](ChoiceRun& c, Update& u) {
      size_t& off = offsets[size_t(c.index)];
      if (echo && !echoed[size_t(c.index)]) {  // with logprobs the Prompt event comes first
        echoed[size_t(c.index)] = true;
        json lp = logprobs >= 0 && u.prompt ? completion_logprobs(tok, *u.prompt, as_ids, off, true, c.prompt[0])
                                            : json(nullptr);
        if (!sse.write(chunk(c, c.prompt_text, lp, nullptr))) return false;
      }
      if (!u.delta.empty() || !u.tokens.empty()) {
        json lp = logprobs >= 0 ? completion_logprobs(tok, u.tokens, as_ids, off, false, 0) : json(nullptr);
        if (!sse.write(chunk(c, u.delta, lp, nullptr))) return false;
      }
      if (u.finished) {
        if (!c.error.empty()) return sse.write({{"error", error_json({500, c.error, "", ""})["error"]}});
        return sse.write(chunk(c, "", nullptr, c.finish));
      }
      return true;
    });
    if (!ok) return false;
    if (p.include_usage &&
        !sse.write({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", opt.model_name},
                    {"choices", json::array()}, {"usage", gen->usage()}}))
      return false;
    return sse.done();
  }, [gen](bool) { gen->cancel_all(); });
}

void Server::Impl::chat(const json& b, const httplib::Request&, httplib::Response& res, Clock::time_point t0) {
  const Tokenizer& tok = *model->tokenizer;
  const ChatRequest r = parse_chat_request(b, limits());
  const GenParams& p = r.p;
  const std::string id = "chatcmpl-" + std::to_string(next_id++);
  const int64_t created = int64_t(std::time(nullptr));
  auto gen = std::make_shared<Generation>(*this, p, t0);
  gen->submit({r.ids}, {r.text}, -1);
  const bool as_ids = p.ids_as_strings;
  const bool want_lp = p.top_logprobs >= 0;

  if (!p.stream) {
    gen->drive([&](ChoiceRun& c, Update& u) {
      c.out += u.delta;
      c.tokens.insert(c.tokens.end(), u.tokens.begin(), u.tokens.end());
      return true;
    });
    if (!gen->first_error().empty()) throw ApiError{500, gen->first_error(), "", ""};
    json choices = json::array();
    for (auto& c : gen->runs())
      choices.push_back({{"index", c.index},
                         {"message", {{"role", "assistant"}, {"content", c.out}}},
                         {"logprobs", want_lp ? chat_logprobs(tok, c.tokens, as_ids) : json(nullptr)},
                         {"finish_reason", c.finish}});
    res.set_content(dump({{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", opt.model_name},
                          {"choices", choices}, {"usage", gen->usage()}}),
                    "application/json");
    return;
  }

  res.set_chunked_content_provider("text/event-stream", [this, gen, p, id, created, as_ids, want_lp,
                                                         &tok](size_t, httplib::DataSink& sink) {
    SseSink sse{sink};
    auto chunk = [&](const ChoiceRun& c, const json& delta, const json& lp, const json& finish) {
      return json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", opt.model_name},
                  {"choices", json::array({{{"index", c.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}}})}};
    };
    for (auto& c : gen->runs())
      if (!sse.write(chunk(c, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) {
        gen->cancel_all();
        return false;
      }
    bool ok = gen->drive([&](ChoiceRun& c, Update& u) {
      if (!u.delta.empty() || !u.tokens.empty()) {
        json lp = want_lp ? chat_logprobs(tok, u.tokens, as_ids) : json(nullptr);
        if (!sse.write(chunk(c, {{"content", u.delta}}, lp, nullptr))) return false;
      }
      if (u.finished) {
        if (!c.error.empty()) return sse.write({{"error", error_json({500, c.error, "", ""})["error"]}});
        return sse.write(chunk(c, json::object(), nullptr, c.finish));
      }
      return true;
    });
    if (!ok) return false;
    if (p.include_usage &&
        !sse.write({{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", opt.model_name},
                    {"choices", json::array()}, {"usage", gen->usage()}}))
      return false;
    return sse.done();
  }, [gen](bool) { gen->cancel_all(); });
}

}  // namespace arbiter::server
