// The OpenAI request bodies of /v1/completions and /v1/chat/completions, parsed and checked
// before anything runs: every known field type- and range-checked, every field the server
// cannot honour refused naming it, the prompt tokenized (the chat template for chat). Apart
// from the HTTP layer so that the libFuzzer harness (fuzz/fuzz_server_request.cpp) runs the
// same code on hostile bodies.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace arbiter {
class ChatTemplate;
class Tokenizer;
}  // namespace arbiter

namespace arbiter::server {

using json = nlohmann::ordered_json;

/// A request the server refuses: the status and OpenAI's error fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field, or ""
  std::string code;   // e.g. "context_length_exceeded", or ""
};
/// Throws ApiError 400 naming param.
[[noreturn]] void bad_request(const std::string& msg, const std::string& param);
/// json::dump that never throws on invalid UTF-8 (token pieces may hold partial characters).
std::string dump(const json& j);

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

/// What requests are checked against: the served model and the server's limits.
struct RequestLimits {
  const Tokenizer& tok;
  int vocab = 0;
  int ctx = 0;           // positions per sequence (prompt and completion)
  int max_logprobs = 0;  // most top log-probabilities per token
  std::string model_name;
  const ChatTemplate* tpl = nullptr;  // nullptr: the model has none
};

struct CompletionRequest {
  GenParams p;
  int logprobs = -1;  // top-N per token, -1: none
  bool echo = false;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;  // each prompt's text (echo)
};

struct ChatRequest {
  GenParams p;
  std::string text;  // the rendered template
  std::vector<int32_t> ids;
};

/// The body as a JSON object (nesting-bounded, io/json.h); ApiError 400 otherwise.
json parse_request_body(const std::string& body);
/// Throw ApiError (400 bad field, 404 another model) or jinja::RaiseError (the template's own
/// refusal); arbiter::Error for a template that fails to render.
CompletionRequest parse_completion_request(const json& body, const RequestLimits& lim);
ChatRequest parse_chat_request(const json& body, const RequestLimits& lim);

}  // namespace arbiter::server
