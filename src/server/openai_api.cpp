// POST /v1/completions and /v1/chat/completions: parse and check the request (every known
// field type-checked, every field we cannot honour refused with 400 naming it), tokenize
// (the chat template for chat), submit one sequence per prompt and choice, and answer as
// JSON or as server-sent events ending in `data: [DONE]`.
#include <httplib.h>

#include <random>

#include "core/error.h"
#include "server/server_impl.h"
#include "server/text_stream.h"

namespace arbiter::server {
namespace {

[[noreturn]] void bad(const std::string& msg, const std::string& param) { throw ApiError{400, msg, param, ""}; }

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

int64_t get_int(const json& b, const char* k, int64_t dflt, int64_t lo, int64_t hi) {
  if (!present(b, k)) return dflt;
  const json& v = b[k];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
    bad(std::string("'") + k + "' must be an integer, got " + dump(v), k);
  const int64_t x = v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
  if (x < lo || x > hi) bad(strformat("'%s' must be in [%lld, %lld], got %lld", k, (long long)lo, (long long)hi, (long long)x), k);
  return x;
}

double get_num(const json& b, const char* k, double dflt, double lo, double hi) {
  if (!present(b, k)) return dflt;
  const json& v = b[k];
  if (!v.is_number()) bad(std::string("'") + k + "' must be a number, got " + dump(v), k);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(strformat("'%s' must be in [%g, %g], got %g", k, lo, hi, x), k);
  return x;
}

bool get_bool(const json& b, const char* k, bool dflt) {
  if (!present(b, k)) return dflt;
  if (!b[k].is_boolean()) bad(std::string("'") + k + "' must be true or false, got " + dump(b[k]), k);
  return b[k].get<bool>();
}

// What both endpoints share: sampling, stop, n, stream.
struct GenParams {
  int max_tokens = 16;
  SamplerParams sampling;
  PenaltyParams penalties;
  int n = 1;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  int top_logprobs = -1;  // per generated token: -1 none
  bool ids_as_strings = false;  // vLLM's return_tokens_as_token_ids
};

GenParams parse_common(const json& b, int max_tokens_dflt, int ctx) {
  for (const char* k : {"suffix", "logit_bias", "response_format", "guided_json", "guided_regex", "grammar"})
    if (present(b, k) && !(b[k].is_object() && b[k].empty()) &&
        !(std::string(k) == "response_format" && b[k].is_object() && b[k].value("type", "") == "text"))
      bad(std::string("'") + k + "' is not supported by this server", k);
  if (present(b, "best_of") && get_int(b, "best_of", 1, 1, 16) != get_int(b, "n", 1, 1, 16))
    bad("'best_of' other than n is not supported", "best_of");
  GenParams p;
  p.max_tokens = int(get_int(b, "max_tokens", max_tokens_dflt, 0, ctx));
  p.sampling.temperature = get_num(b, "temperature", 1.0, 0, 2);
  p.sampling.top_p = get_num(b, "top_p", 1.0, 1e-9, 1);
  const int64_t top_k = get_int(b, "top_k", 0, -1, 1 << 30);
  p.sampling.top_k = int(top_k < 0 ? 0 : top_k);
  p.sampling.min_p = get_num(b, "min_p", 0, 0, 1);
  p.sampling.seed = present(b, "seed") ? uint64_t(get_int(b, "seed", 0, INT64_MIN, INT64_MAX)) : std::random_device{}();
  p.penalties.presence = get_num(b, "presence_penalty", 0, -2, 2);
  p.penalties.frequency = get_num(b, "frequency_penalty", 0, -2, 2);
  p.penalties.repeat = get_num(b, "repetition_penalty", 1, 1e-6, 10);
  p.n = int(get_int(b, "n", 1, 1, 16));
  if (present(b, "stop")) {
    const json& s = b["stop"];
    if (s.is_string()) p.stop.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 16) {
      for (const json& e : s) {
        if (!e.is_string()) bad("'stop' must be a string or a list of at most 16 strings", "stop");
        p.stop.push_back(e.get<std::string>());
      }
    } else bad("'stop' must be a string or a list of at most 16 strings", "stop");
  }
  p.stream = get_bool(b, "stream", false);
  if (present(b, "stream_options")) {
    if (!b["stream_options"].is_object()) bad("'stream_options' must be an object", "stream_options");
    p.include_usage = get_bool(b["stream_options"], "include_usage", false);
  }
  p.ids_as_strings = get_bool(b, "return_tokens_as_token_ids", false);
  return p;
}

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
      if (pr.empty()) bad("the prompt is empty (and the model adds no BOS token)", "prompt");
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

void check_model(const json& b, const Server::Impl& I) {
  if (!present(b, "model")) return;
  if (!b["model"].is_string()) bad("'model' must be a string", "model");
  if (b["model"].get<std::string>() != I.opt.model_name)
    throw ApiError{404, "model '" + b["model"].get<std::string>() + "' is not served here (this server serves '" +
                            I.opt.model_name + "')", "model", "model_not_found"};
}

}  // namespace

void Server::Impl::completions(const json& b, const httplib::Request&, httplib::Response& res, Clock::time_point t0) {
  check_model(b, *this);
  const Tokenizer& tok = *model->tokenizer;
  GenParams p = parse_common(b, 16, sched->max_ctx());
  const int logprobs = present(b, "logprobs") ? int(get_int(b, "logprobs", 0, 0, opt.max_logprobs)) : -1;
  p.top_logprobs = logprobs;
  const bool echo = get_bool(b, "echo", false);
  if (!present(b, "prompt")) bad("'prompt' is required", "prompt");
  const json& pj = b["prompt"];
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  auto ids_of = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const json& e : arr) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= model->config.vocab)
        bad(strformat("'prompt' token ids must be integers in [0, %d)", model->config.vocab), "prompt");
      ids.push_back(int32_t(e.get<int64_t>()));
    }
    return ids;
  };
  auto add_text = [&](const std::string& s) {
    prompts.push_back(tok.encode(s, true, true));
    texts.push_back(s);
  };
  auto add_ids = [&](const json& arr) {
    prompts.push_back(ids_of(arr));
    texts.push_back(tok.decode(prompts.back(), false));
  };
  if (pj.is_string()) add_text(pj.get<std::string>());
  else if (pj.is_array() && !pj.empty() && pj[0].is_number()) add_ids(pj);
  else if (pj.is_array() && !pj.empty() && pj.size() <= 64) {
    for (const json& e : pj) {
      if (e.is_string()) add_text(e.get<std::string>());
      else if (e.is_array() && !e.empty()) add_ids(e);
      else bad("'prompt' must be a string, a list of token ids, or a list of (at most 64) of these", "prompt");
    }
  } else bad("'prompt' must be a string, a list of token ids, or a list of (at most 64) of these", "prompt");

  const std::string id = "cmpl-" + std::to_string(next_id++);
  const int64_t created = int64_t(std::time(nullptr));
  auto gen = std::make_shared<Generation>(*this, p, t0);
  gen->submit(prompts, texts, echo && logprobs >= 0 ? std::max(logprobs, 0) : -1);
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
  check_model(b, *this);
  const Tokenizer& tok = *model->tokenizer;
  if (!tpl)
    bad("model '" + opt.model_name + "' has no chat template (none in its files); start the server with "
        "--chat-template FILE, or use /v1/completions", "messages");
  json body = b;
  if (present(b, "max_completion_tokens")) body["max_tokens"] = b["max_completion_tokens"];
  GenParams p = parse_common(body, -1, sched->max_ctx());
  if (!present(body, "max_tokens")) p.max_tokens = -1;  // until EOS or the context is full
  if (get_bool(b, "logprobs", false)) p.top_logprobs = int(get_int(b, "top_logprobs", 0, 0, opt.max_logprobs));
  else if (present(b, "top_logprobs")) bad("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (present(b, "tool_choice") && !(b["tool_choice"].is_string() && (b["tool_choice"] == "none" || b["tool_choice"] == "auto")))
    bad("'tool_choice' other than \"none\" or \"auto\" is not supported (tool calls are not parsed from the output)",
        "tool_choice");
  if (!present(b, "messages") || !b["messages"].is_array() || b["messages"].empty())
    bad("'messages' must be a non-empty list", "messages");
  for (const json& m : b["messages"])
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("each message must be an object with a string 'role'", "messages");
  json tools = present(b, "tools") ? b["tools"] : json(nullptr);
  if (!tools.is_null() && !tools.is_array()) bad("'tools' must be a list", "tools");
  json extra = json::object();
  if (present(b, "chat_template_kwargs")) {
    if (!b["chat_template_kwargs"].is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    extra = b["chat_template_kwargs"];
  }
  const std::string text = tpl->render(b["messages"], true, tools, extra);
  std::vector<int32_t> ids = tok.encode(text, false, true);

  const std::string id = "chatcmpl-" + std::to_string(next_id++);
  const int64_t created = int64_t(std::time(nullptr));
  auto gen = std::make_shared<Generation>(*this, p, t0);
  gen->submit({ids}, {text}, -1);
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
