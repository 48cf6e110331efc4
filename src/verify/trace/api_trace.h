// Teacher-forced traces through an OpenAI-compatible API (`trace --endpoint`): each chunk
// of the trace shape goes to POST /v1/completions as token ids with echo and logprobs, and
// the prompt tokens' log-probabilities come back (or, for servers without echo, one request
// per position asks for the next token's top logprobs). Any engine that serves the API (vLLM,
// llama.cpp's llama-server, arbiter serve) can so be judged against the ref tier without
// its source.
//
// What an API cannot give, the header says (`# api_limits`): rows hold log-probabilities,
// not raw logits (lse is unknown and written as 0, so nll = -logprob still holds; compare
// then judges both sides as log-probabilities, see `holds_logprobs`), the top-k is the
// API's top logprobs (at most what the server allows), and the compute dtype, providers
// and weights of the serving engine are unknown.
#pragma once
#include <string>

#include "model/model.h"
#include "verify/trace/trace.h"
#include "verify/trace/trace_run.h"

namespace arbiter::verify {

struct ApiTraceOptions {
  std::string endpoint;    // http://HOST:PORT, with or without a trailing /v1
  std::string api_model;   // the "model" field of each request
  std::string api_key;     // Authorization: Bearer (empty: none)
  double timeout_s = 600;  // per request
  std::string compute;     // the serving engine's compute dtype as the user states it ("" unknown:
                           // compare's drift gate is then not applied)
  /// "echo": one request per chunk, the prompt tokens scored (vLLM, arbiter serve). "next":
  /// one request per position, the prefix only, the next token's top logprobs (servers
  /// without echo, e.g. llama.cpp's); the target must then be among them.
  std::string mode = "echo";
  int top = 0;             // top logprobs to ask for (at least --topk)
  TraceRunOptions trace;   // shape, topk, corpus, output, header extras
};

/// Runs the shape's chunks through the endpoint and writes the trace. m gives the tokenizer
/// (the corpus is tokenized here, sent as ids) and the model identity of the header (the
/// caller asserts the endpoint serves this checkpoint). Throws arbiter::Error naming the
/// endpoint and chunk on an unreachable server, an HTTP error (with the server's message),
/// echoed tokens that differ from those sent, or fewer top logprobs than --topk.
TraceRunResult run_api_trace(const Model& m, const ApiTraceOptions& opt);

/// Whether a trace holds log-probabilities (an API trace's `# logits logprobs` line).
bool holds_logprobs(const Trace& t);
/// The trace with every logit made a log-probability (logit - lse, lse 0), so it can be
/// compared with an API trace; returns t unchanged when it already holds log-probabilities.
Trace as_logprobs(const Trace& t);

}  // namespace arbiter::verify
