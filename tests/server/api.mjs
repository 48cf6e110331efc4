// arbiter serve on the shipped TinyStories model, driven by the official openai client:
// completions and chat, non-stream and stream (stream must equal non-stream), logprobs and
// echo, stop strings, n, seeds (same seed, same text), every error status, /metrics, and a
// clean SIGTERM exit. Greedy text is also checked against `arbiter generate`.
// Add a case: a block below with check()/eq(); it runs against the same server.
import { execFileSync } from "node:child_process";
import path from "node:path";
import OpenAI from "openai";
import { ARBITER, MODEL, ROOT, check, eq, readSse, startServer, summary } from "./common.mjs";

const KEY = "test-key";
const srv = await startServer(["--api-key", KEY, "--parallel", "2", "--ctx", "96",
  "--chat-template", path.join(ROOT, "tests/server/tiny_chat.jinja")]);
const client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: KEY, maxRetries: 0, timeout: 60000 });
const model = "TinyStories-656K";
const prompt = "Once upon a time";

async function status(p) {
  try { await p; return 200; } catch (e) { return e.status ?? String(e); }
}

try {
  // /v1/models
  const models = await client.models.list();
  eq(models.data.map((m) => m.id), [model], "models list");

  // Greedy completion equals `arbiter generate` (the in-process engine path).
  const greedy = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  const cli = execFileSync(ARBITER, ["generate", "-m", MODEL, "-p", prompt, "-n", "24", "--temp", "0", "--seed", "1"],
    { stdio: ["ignore", "pipe", "ignore"] }).toString().replace(/\n$/, "");
  eq(greedy.choices[0].text, cli, "greedy completion equals arbiter generate");
  eq(greedy.usage.completion_tokens, 24, "completion_tokens");
  eq(greedy.choices[0].finish_reason, "length", "finish_reason length");

  // Stream equals non-stream, greedy and seeded sampling; the same seed gives the same text.
  for (const params of [{ temperature: 0 }, { temperature: 0.9, top_p: 0.95, seed: 7 }, { temperature: 1.2, top_k: 20, min_p: 0.05, seed: 11 }]) {
    const a = await client.completions.create({ model, prompt, max_tokens: 20, ...params });
    const b = await client.completions.create({ model, prompt, max_tokens: 20, ...params });
    eq(a.choices[0].text, b.choices[0].text, `same params same text ${JSON.stringify(params)}`);
    let streamed = "", finish = null, chunks = 0;
    for await (const ch of await client.completions.create({ model, prompt, max_tokens: 20, stream: true, ...params })) {
      streamed += ch.choices[0]?.text ?? "";
      finish = ch.choices[0]?.finish_reason ?? finish;
      chunks++;
    }
    eq(streamed, a.choices[0].text, `stream equals non-stream ${JSON.stringify(params)}`);
    check(chunks >= 2, "stream came in several chunks");
    eq(finish, a.choices[0].finish_reason, "stream finish_reason");
  }
  const s1 = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 1.0, seed: 1 });
  const s2 = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 1.0, seed: 2 });
  const s3 = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 1.0, seed: 3 });
  check(new Set([s1, s2, s3].map((r) => r.choices[0].text)).size > 1, "different seeds give different texts");

  // Raw SSE framing: every event a JSON object, [DONE] last, usage when asked.
  const raw = await fetch(srv.base + "/v1/completions", { method: "POST", headers: { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true } }) });
  eq(raw.headers.get("content-type")?.split(";")[0], "text/event-stream", "SSE content type");
  const sse = await readSse(raw);
  check(sse.done, "SSE ends with data: [DONE]");
  eq(sse.events.at(-1).usage?.completion_tokens, 5, "usage chunk");

  // Logprobs: top-N dicts, the greedy token is the most likely one.
  const lp = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, logprobs: 3 });
  const L = lp.choices[0].logprobs;
  eq(L.tokens.length, 6, "one logprob entry per token");
  for (let i = 0; i < L.tokens.length; i++) {
    const top = Object.values(L.top_logprobs[i]);
    check(top.length >= 1 && top.length <= 3, "top_logprobs size");
    check(L.token_logprobs[i] <= 0 && Math.abs(L.token_logprobs[i] - Math.max(...top)) < 1e-12, "greedy token has the top logprob");
  }
  // Echo + logprobs + max_tokens 0: the prompt's teacher-forced scoring (lm-eval loglikelihood).
  const ids = [1, 80, 147, 201, 282, 57];
  const echo = await client.completions.create({ model, prompt: ids, max_tokens: 0, logprobs: 2, echo: true, return_tokens_as_token_ids: true });
  const E = echo.choices[0].logprobs;
  eq(E.tokens, ids.map((i) => `token_id:${i}`), "echo tokens are the prompt ids");
  eq(E.token_logprobs[0], null, "the first prompt token has no logprob");
  check(E.token_logprobs.slice(1).every((x) => typeof x === "number" && x <= 0), "prompt logprobs");
  eq(echo.usage.completion_tokens, 0, "max_tokens 0 generates nothing");

  // Stop strings are cut out of the text (and of the stream).
  const full = greedy.choices[0].text;
  const stop = full.slice(12, 18);
  const cut = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop: [stop] });
  eq(cut.choices[0].text, full.slice(0, full.indexOf(stop)), "stop string excluded");
  eq(cut.choices[0].finish_reason, "stop", "finish_reason stop");
  let cutStream = "";
  for await (const ch of await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop, stream: true }))
    cutStream += ch.choices[0]?.text ?? "";
  eq(cutStream, cut.choices[0].text, "stop string excluded from the stream");

  // n and lists of prompts.
  const multi = await client.completions.create({ model, prompt: [prompt, "The dog"], n: 2, max_tokens: 4, temperature: 0.8, seed: 5 });
  eq(multi.choices.map((c) => c.index), [0, 1, 2, 3], "n x prompts choices");

  // Chat: non-stream, stream with role and content deltas, logprobs.
  const messages = [{ role: "user", content: "Once upon a time, there was a cat" }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
  eq(chat.choices[0].message.role, "assistant", "chat role");
  check(chat.choices[0].message.content.length > 0, "chat content");
  let chatStreamed = "", roles = [];
  for await (const ch of await client.chat.completions.create({ model, messages, max_completion_tokens: 16, temperature: 0, stream: true })) {
    if (ch.choices[0]?.delta?.role) roles.push(ch.choices[0].delta.role);
    chatStreamed += ch.choices[0]?.delta?.content ?? "";
  }
  eq(roles, ["assistant"], "one role delta");
  eq(chatStreamed, chat.choices[0].message.content, "chat stream equals non-stream");
  const chatLp = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  eq(chatLp.choices[0].logprobs.content.length, 4, "chat logprobs per token");
  eq(chatLp.choices[0].logprobs.content[0].top_logprobs.length, 2, "chat top_logprobs");
  const chatSeed = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 1.0, seed: 3 });
  const chatSeed2 = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 1.0, seed: 3 });
  eq(chatSeed.choices[0].message.content, chatSeed2.choices[0].message.content, "chat: same seed same text");

  // Errors: status and OpenAI's error shape.
  eq(await status(client.completions.create({ model, prompt, max_tokens: "many" })), 400, "ill-typed field: 400");
  eq(await status(client.completions.create({ model, prompt, logit_bias: { 5: 10 } })), 400, "unsupported field: 400");
  eq(await status(client.completions.create({ model: "gpt-4", prompt })), 404, "unknown model: 404");
  eq(await status(new OpenAI({ baseURL: srv.base + "/v1", apiKey: "wrong", maxRetries: 0 }).models.list()), 401, "bad key: 401");
  eq(await status(client.completions.create({ model, prompt: "Once upon a time ".repeat(60) })), 413, "prompt over the context: 413");
  try {
    await client.chat.completions.create({ model, messages: [{ role: "tool", content: "x" }] });
    check(false, "template raise_exception must fail");
  } catch (e) {
    eq(e.status, 400, "raise_exception: 400");
    check(String(e.message).includes("this template takes no tool messages"), "raise_exception message reaches the client");
  }
  const bad = await fetch(srv.base + "/v1/completions", { method: "POST", headers: { Authorization: `Bearer ${KEY}` }, body: "{not json" });
  eq(bad.status, 400, "malformed JSON: 400");
  eq(typeof (await bad.json()).error?.message, "string", "error JSON shape");
  // 100k levels of nesting: refused at 64 levels, never recursed into (that overflowed stacks).
  const deep = await fetch(srv.base + "/v1/completions", {
    method: "POST", headers: { Authorization: `Bearer ${KEY}` }, body: "[".repeat(100000) + "]".repeat(100000) });
  eq(deep.status, 400, "deeply nested JSON: 400");
  check(String((await deep.json()).error?.message).includes("nested deeper than 64 levels"), "nesting limit named");
  eq((await fetch(srv.base + "/health")).status, 200, "server alive after the nested body");
  eq((await fetch(srv.base + "/v2/nothing")).status, 404, "unknown path: 404");

  // Metrics in Prometheus text.
  const metrics = await (await fetch(srv.base + "/metrics")).text();
  check(/arbiter_requests_total\{endpoint="\/v1\/completions",status="200"\} \d+/.test(metrics), "requests counter");
  check(/arbiter_time_to_first_token_seconds_count [1-9]\d*/.test(metrics), "TTFT histogram");
  check(/arbiter_inter_token_latency_seconds_bucket\{le="\+Inf"\} [1-9]\d*/.test(metrics), "ITL histogram");
  check(/arbiter_generation_tokens_total [1-9]\d*/.test(metrics), "tokens out counter");
  check(/arbiter_queue_depth 0/.test(metrics), "queue depth gauge");
} catch (e) {
  check(false, "unexpected exception: " + (e.stack ?? e));
}
const code = await srv.stop();
eq(code, 0, "SIGTERM: clean exit");
if (!summary()) { console.error(srv.stderr()); process.exit(1); }
