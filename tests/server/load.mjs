// Load and abuse on loopback: 64 concurrent streaming clients (3 requests each, bounded),
// with random disconnects, malformed JSON, oversized bodies, ill-typed fields and prompts
// over the context mixed in. Every request that survives must be exactly right: its text a
// prefix of the single-client reference for its (prompt, seed) and its token count what it
// asked for; refusals must carry the right status (503 when the queue is full is allowed).
// Afterwards the server must be healthy with no slot or queue place leaked, and exit 0 on
// SIGTERM (under `make asan` a leak or a memory error fails that exit).
import OpenAI from "openai";
import { check, eq, readSse, startServer, summary } from "./common.mjs";

const CLIENTS = 64, ROUNDS = 3, MAX_BODY = 65536, CTX = 128;
const srv = await startServer(["--parallel", "4", "--queue", "8", "--http-threads", "80", "--ctx", String(CTX), "--max-body", String(MAX_BODY)]);
const client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "none", maxRetries: 0, timeout: 120000 });
const model = "TinyStories-656K";
const prompts = ["Once upon a time", "The little dog", "Lily and Ben went", "One day, a bird"];
const seeds = [1, 2, 3];

// Deterministic mulberry32 so a failure can be replayed.
let state = 12345;
const rand = () => { state |= 0; state = (state + 0x6d2b79f5) | 0; let t = Math.imul(state ^ (state >>> 15), 1 | state);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };

const tally = { ok: 0, busy: 0, aborted: 0, refused: 0 };
try {
  // References, one request at a time.
  const ref = new Map();
  for (const p of prompts)
    for (const s of seeds) {
      const r = await client.completions.create({ model, prompt: p, max_tokens: 24, temperature: 0.9, seed: s });
      ref.set(`${p}|${s}`, r.choices[0].text);
    }

  const post = (body, raw = false) => fetch(srv.base + "/v1/completions", { method: "POST",
    headers: { "Content-Type": "application/json" }, body: raw ? body : JSON.stringify(body) });

  async function one(kind) {
    const p = prompts[Math.floor(rand() * prompts.length)], s = seeds[Math.floor(rand() * seeds.length)];
    const n = 1 + Math.floor(rand() * 24);
    if (kind < 0.6) {  // a streaming completion that must be right
      const res = await post({ model, prompt: p, max_tokens: n, temperature: 0.9, seed: s, stream: true,
        stream_options: { include_usage: true } });
      if (res.status === 503) { tally.busy++; await res.text(); return; }
      eq(res.status, 200, "stream status");
      const { events, done } = await readSse(res);
      check(done, "stream ends with [DONE]");
      const text = events.filter((e) => e.choices?.length).map((e) => e.choices[0].text).join("");
      const usage = events.at(-1)?.usage;
      check(ref.get(`${p}|${s}`).startsWith(text), `interleaved text is the reference's prefix (${p}|${s}|${n}): ${JSON.stringify(text)}`);
      check(usage && (usage.completion_tokens === n || events.some((e) => e.choices?.[0]?.finish_reason === "stop")),
        `token count ${usage?.completion_tokens} == max_tokens ${n}`);
      tally.ok++;
    } else if (kind < 0.7) {  // the client goes away mid-stream
      const ac = new AbortController();
      const res = await fetch(srv.base + "/v1/completions", { method: "POST", signal: ac.signal,
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model, prompt: p, max_tokens: 60, temperature: 0.9, seed: s, stream: true }) }).catch(() => null);
      if (res && res.status === 200) {
        const reader = res.body.getReader();
        await reader.read().catch(() => {});
        ac.abort();
      } else if (res) {
        await res.text();
      }
      tally.aborted++;
    } else if (kind < 0.8) {
      const res = await post('{"model": "' + model + '", "prompt": [1, 2,', true);
      eq(res.status, 400, "malformed JSON: 400");
      await res.text();
      tally.refused++;
    } else if (kind < 0.85) {
      const res = await post({ model, prompt: "x".repeat(MAX_BODY * 2) }).catch(() => null);
      check(res === null || res.status === 413, `oversized body: 413 or a closed connection, got ${res?.status}`);
      if (res) await res.text();
      tally.refused++;
    } else if (kind < 0.95) {
      const res = await post({ model, prompt: Array.from({ length: CTX + 10 }, (_, i) => 10 + (i % 50)), max_tokens: 4 });
      eq(res.status, 413, "prompt over the context: 413");
      eq((await res.json()).error?.code, "context_length_exceeded", "413 error code");
      tally.refused++;
    } else {
      const res = await post({ model, prompt: p, temperature: "hot" });
      eq(res.status, 400, "ill-typed temperature: 400");
      await res.text();
      tally.refused++;
    }
  }

  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async () => {
    for (let r = 0; r < ROUNDS; r++) await one(rand()).catch((e) => check(false, "client error: " + (e.stack ?? e)));
  }));
  console.log(`load: ${JSON.stringify(tally)} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  check(tally.ok > 0, "some streams completed");
  check(tally.busy > 0, "a full queue answered 503");

  // Nothing leaked: every slot and queue place comes back (disconnected streams included).
  let metrics = "";
  for (let i = 0; i < 100; i++) {
    metrics = await (await fetch(srv.base + "/metrics")).text();
    if (/arbiter_active_sequences 0\n/.test(metrics) && /arbiter_queue_depth 0\n/.test(metrics)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(/arbiter_active_sequences 0\n/.test(metrics), "no active sequence left");
  check(/arbiter_queue_depth 0\n/.test(metrics), "no queued sequence left");
  eq((await fetch(srv.base + "/health")).status, 200, "healthy after the load");
  const after = await client.completions.create({ model, prompt: prompts[0], max_tokens: 24, temperature: 0.9, seed: 1 });
  eq(after.choices[0].text, ref.get(`${prompts[0]}|1`), "same answer after the load");
} catch (e) {
  check(false, "unexpected exception: " + (e.stack ?? e));
}
const code = await srv.stop();
eq(code, 0, "SIGTERM after the load: clean exit");
if (!summary()) { console.error(srv.stderr().slice(-4000)); process.exit(1); }
