// Continuous batching through `arbiter serve --batching continuous` (docs/serve.md), driven by
// the official openai client on the shipped stories260K: every prompt is first asked alone
// (greedy, and sampled with a seed); then 64 concurrent streams of the same requests, a
// quarter of them disconnecting at random after their first chunk, run in one batch. Each
// stream that is not cut must give exactly its alone text (batch invariance: ref and cpu
// compute each row independently of the batch). Afterwards no sequence or KV block is left
// held (/metrics' pool gauges), the answers are unchanged, a pool smaller than a context and --inject are refused
// at start-up, and SIGTERM exits 0 (under ASan: no leak, no memory error).
// Add a case: a request shape in `shapes` below; it runs alone and in the batch.
import { spawnSync } from "node:child_process";
import path from "node:path";
import OpenAI from "openai";
import { ARBITER, ROOT, check, eq, readSse, startServer, summary } from "./common.mjs";

const MODEL = path.join(ROOT, "models/stories260K/stories260K.gguf");
const STREAMS = 64, CTX = 64;
const srv = await startServer(["--batching", "continuous", "--parallel", String(STREAMS), "--queue", "16",
  "--http-threads", String(STREAMS + 24), "--ctx", String(CTX), "--step-tokens", "128"], 60000, MODEL);
const client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "none", maxRetries: 0, timeout: 120000 });
const model = "stories260K.gguf";
const prompts = ["Once upon a time", "The little dog", "Lily and Ben went", "One day, a bird", "Tom", "A big red ball was"];
const shapes = [{ temperature: 0 }, { temperature: 0.9, seed: 5 }];

// Deterministic mulberry32 so a failure can be replayed.
let state = 4242;
const rand = () => { state |= 0; state = (state + 0x6d2b79f5) | 0; let t = Math.imul(state ^ (state >>> 15), 1 | state);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };

const body = (i) => ({ model, prompt: prompts[i % prompts.length], max_tokens: 10, ...shapes[Math.floor(i / prompts.length) % shapes.length] });
const KINDS = prompts.length * shapes.length;
const post = (b, signal) => fetch(srv.base + "/v1/completions", { method: "POST", signal,
  headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ...b, stream: true }) });
const tally = { ok: 0, cut: 0 };
try {
  const alone = [];
  for (let k = 0; k < KINDS; k++) alone.push((await client.completions.create(body(k))).choices[0].text);
  check(alone.some((t) => t.length > 0), "alone requests generate text");

  await Promise.all(Array.from({ length: STREAMS }, async (_, i) => {
    const k = i % KINDS;
    if (rand() < 0.25) {  // the client goes away after its first chunk
      const ac = new AbortController();
      const res = await post(body(k), ac.signal).catch(() => null);
      if (res) {
        await res.body.getReader().read().catch(() => {});
        ac.abort();
      }
      tally.cut++;
      return;
    }
    const res = await post(body(k));
    eq(res.status, 200, `stream ${i} status`);
    const { events, done } = await readSse(res);
    check(done, `stream ${i} ends with [DONE]`);
    const text = events.filter((e) => e.choices?.length).map((e) => e.choices[0].text).join("");
    eq(text, alone[k], `stream ${i} in the batch equals its alone text`);
    tally.ok++;
  }));
  console.log(`batching: ${JSON.stringify(tally)}`);
  check(tally.ok > STREAMS / 2, "most streams completed");

  let metrics = "";
  for (let i = 0; i < 100; i++) {
    metrics = await (await fetch(srv.base + "/metrics")).text();
    if (/arbiter_active_sequences 0\n/.test(metrics) && /arbiter_queue_depth 0\n/.test(metrics)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(/arbiter_active_sequences 0\n/.test(metrics), "no active sequence left");
  check(/arbiter_queue_depth 0\n/.test(metrics), "no queued sequence left");
  // The paged pool's gauges: every block back, the batched forwards counted.
  const gauge = (name) => Number((metrics.match(new RegExp(`\n${name} (\\d+)\n`)) ?? [])[1]);
  check(gauge("arbiter_kv_blocks") > 0 && gauge("arbiter_kv_blocks_free") === gauge("arbiter_kv_blocks"),
        `every KV block free after the batch: ${gauge("arbiter_kv_blocks_free")} of ${gauge("arbiter_kv_blocks")}`);
  eq(gauge("arbiter_kv_blocks_used"), 0, "no KV block used after the batch");
  check(gauge("arbiter_batched_forwards_total") > 0, "batched forwards counted");
  eq((await fetch(srv.base + "/health")).status, 200, "healthy after the batch");
  eq((await client.completions.create(body(1))).choices[0].text, alone[1], "same answer after the batch");
} catch (e) {
  check(false, "unexpected exception: " + (e.stack ?? e));
}
const code = await srv.stop();
eq(code, 0, "SIGTERM after the batch: clean exit");

// Start-up refusals: one line naming the problem, a non-zero exit, before any port is bound.
for (const [args, want] of [[["--kv-blocks", "2", "--ctx", "64"], "less than one context of 64"],
                            [["--inject", "op=q,scale=2"], "--inject needs --batching slices"]]) {
  const r = spawnSync(ARBITER, ["serve", "-m", MODEL, "--port", "0", "--batching", "continuous", ...args], { encoding: "utf8", timeout: 60000 });
  check(r.status !== 0 && r.stderr.includes(want), `refused (${args.join(" ")}): ${r.status} ${r.stderr.trim().split("\n").at(-1)}`);
}
if (!summary()) { console.error(srv.stderr().slice(-4000)); process.exit(1); }
