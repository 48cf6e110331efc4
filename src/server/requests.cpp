#include "server/requests.h"

#include <cmath>
#include <random>

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace arbiter::server {

void bad_request(const std::string& msg, const std::string& param) { throw ApiError{400, msg, param, ""}; }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_request_body(const std::string& body) {
  json j;
  try {
    j = parse_json_bounded<json>(body, "request body", "[server]");
  } catch (const Error& ex) {
    throw ApiError{400, ex.what(), "", ""};
  }
  if (!j.is_object()) throw ApiError{400, "request body must be a JSON object", "", ""};
  return j;
}

namespace {

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

int64_t get_int(const json& b, const char* k, int64_t dflt, int64_t lo, int64_t hi) {
  if (!present(b, k)) return dflt;
  const json& v = b[k];
  const bool whole_float = v.is_number_float() && v.get<double>() == std::floor(v.get<double>());
  if (!v.is_number_integer() && !whole_float) bad_request(std::string("'") + k + "' must be an integer, got " + dump(v), k);
  // Checked before converting: a float beyond int64 or an integer beyond it (stored unsigned)
  // has no int64 value.
  const bool fits = whole_float ? v.get<double>() >= -0x1p63 && v.get<double>() < 0x1p63
                                : !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX));
  const int64_t x = !fits ? 0 : whole_float ? int64_t(v.get<double>()) : v.get<int64_t>();
  if (!fits || x < lo || x > hi)
    bad_request(strformat("'%s' must be in [%lld, %lld], got %s", k, (long long)lo, (long long)hi, dump(v).c_str()), k);
  return x;
}

double get_num(const json& b, const char* k, double dflt, double lo, double hi) {
  if (!present(b, k)) return dflt;
  const json& v = b[k];
  if (!v.is_number()) bad_request(std::string("'") + k + "' must be a number, got " + dump(v), k);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad_request(strformat("'%s' must be in [%g, %g], got %g", k, lo, hi, x), k);
  return x;
}

bool get_bool(const json& b, const char* k, bool dflt) {
  if (!present(b, k)) return dflt;
  if (!b[k].is_boolean()) bad_request(std::string("'") + k + "' must be true or false, got " + dump(b[k]), k);
  return b[k].get<bool>();
}


GenParams parse_common(const json& b, int max_tokens_dflt, int ctx) {
  for (const char* k : {"suffix", "logit_bias", "response_format", "guided_json", "guided_regex", "grammar"})
    if (present(b, k) && !(b[k].is_object() && b[k].empty()) &&
        !(std::string(k) == "response_format" && b[k].is_object() && b[k].value("type", "") == "text"))
      bad_request(std::string("'") + k + "' is not supported by this server", k);
  if (present(b, "best_of") && get_int(b, "best_of", 1, 1, 16) != get_int(b, "n", 1, 1, 16))
    bad_request("'best_of' other than n is not supported", "best_of");
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
        if (!e.is_string()) bad_request("'stop' must be a string or a list of at most 16 strings", "stop");
        p.stop.push_back(e.get<std::string>());
      }
    } else bad_request("'stop' must be a string or a list of at most 16 strings", "stop");
  }
  p.stream = get_bool(b, "stream", false);
  if (present(b, "stream_options")) {
    if (!b["stream_options"].is_object()) bad_request("'stream_options' must be an object", "stream_options");
    p.include_usage = get_bool(b["stream_options"], "include_usage", false);
  }
  p.ids_as_strings = get_bool(b, "return_tokens_as_token_ids", false);
  return p;
}

void check_model(const json& b, const RequestLimits& lim) {
  if (!present(b, "model")) return;
  if (!b["model"].is_string()) bad_request("'model' must be a string", "model");
  if (b["model"].get<std::string>() != lim.model_name)
    throw ApiError{404, "model '" + b["model"].get<std::string>() + "' is not served here (this server serves '" +
                            lim.model_name + "')", "model", "model_not_found"};
}

}  // namespace

CompletionRequest parse_completion_request(const json& b, const RequestLimits& lim) {
  check_model(b, lim);
  CompletionRequest r;
  r.p = parse_common(b, 16, lim.ctx);
  r.logprobs = present(b, "logprobs") ? int(get_int(b, "logprobs", 0, 0, lim.max_logprobs)) : -1;
  r.p.top_logprobs = r.logprobs;
  r.echo = get_bool(b, "echo", false);
  if (!present(b, "prompt")) bad_request("'prompt' is required", "prompt");
  const json& pj = b["prompt"];
  auto ids_of = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const json& e : arr) {
      const bool valid = e.is_number_unsigned() ? e.get<uint64_t>() < uint64_t(lim.vocab)
                                                : e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < lim.vocab;
      if (!valid)
        bad_request(strformat("'prompt' token ids must be integers in [0, %d)", lim.vocab), "prompt");
      ids.push_back(int32_t(e.get<int64_t>()));
    }
    return ids;
  };
  auto add_text = [&](const std::string& s) {
    r.prompts.push_back(lim.tok.encode(s, true, true));
    r.texts.push_back(s);
  };
  auto add_ids = [&](const json& arr) {
    r.prompts.push_back(ids_of(arr));
    r.texts.push_back(lim.tok.decode(r.prompts.back(), false));
  };
  const char* shape = "'prompt' must be a string, a list of token ids, or a list of (at most 64) of these";
  if (pj.is_string()) add_text(pj.get<std::string>());
  else if (pj.is_array() && !pj.empty() && pj[0].is_number()) add_ids(pj);
  else if (pj.is_array() && !pj.empty() && pj.size() <= 64) {
    for (const json& e : pj) {
      if (e.is_string()) add_text(e.get<std::string>());
      else if (e.is_array() && !e.empty()) add_ids(e);
      else bad_request(shape, "prompt");
    }
  } else bad_request(shape, "prompt");
  return r;
}

ChatRequest parse_chat_request(const json& b, const RequestLimits& lim) {
  check_model(b, lim);
  if (!lim.tpl)
    bad_request("model '" + lim.model_name + "' has no chat template (none in its files); start the server with "
                "--chat-template FILE, or use /v1/completions", "messages");
  ChatRequest r;
  json body = b;
  if (present(b, "max_completion_tokens")) body["max_tokens"] = b["max_completion_tokens"];
  r.p = parse_common(body, -1, lim.ctx);
  if (!present(body, "max_tokens")) r.p.max_tokens = -1;  // until EOS or the context is full
  if (get_bool(b, "logprobs", false)) r.p.top_logprobs = int(get_int(b, "top_logprobs", 0, 0, lim.max_logprobs));
  else if (present(b, "top_logprobs")) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (present(b, "tool_choice") && !(b["tool_choice"].is_string() && (b["tool_choice"] == "none" || b["tool_choice"] == "auto")))
    bad_request("'tool_choice' other than \"none\" or \"auto\" is not supported (tool calls are not parsed from the output)",
                "tool_choice");
  if (!present(b, "messages") || !b["messages"].is_array() || b["messages"].empty())
    bad_request("'messages' must be a non-empty list", "messages");
  for (const json& m : b["messages"])
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad_request("each message must be an object with a string 'role'", "messages");
  json tools = present(b, "tools") ? b["tools"] : json(nullptr);
  if (!tools.is_null() && !tools.is_array()) bad_request("'tools' must be a list", "tools");
  json extra = json::object();
  if (present(b, "chat_template_kwargs")) {
    if (!b["chat_template_kwargs"].is_object()) bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    extra = b["chat_template_kwargs"];
  }
  r.text = lim.tpl->render(b["messages"], true, tools, extra);
  r.ids = lim.tok.encode(r.text, false, true);
  return r;
}

}  // namespace arbiter::server
