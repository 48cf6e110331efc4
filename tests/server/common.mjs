// Shared by the server tests: start `arbiter serve` on a free loopback port, wait until it
// is ready, stop it with SIGTERM and check that it exits cleanly (0: no crash, and under
// ASan no leak).
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const MODEL = path.join(ROOT, "models/TinyStories-656K");
export const ARBITER = process.argv[2];
if (!ARBITER) throw new Error("usage: node TEST.mjs PATH/TO/arbiter");

let failures = 0, passes = 0;
export function check(cond, what) {
  if (cond) { passes++; return; }
  failures++;
  console.error(`FAIL: ${what}`);
}
export function eq(a, b, what) {
  const ok = JSON.stringify(a) === JSON.stringify(b);
  check(ok, `${what}: got ${JSON.stringify(a)}, want ${JSON.stringify(b)}`);
}
export function summary() {
  console.log(`${passes} passed, ${failures} failed`);
  return failures === 0;
}

// Starts the server on model (default MODEL); resolves when /health says 200. Rejects after
// timeoutMs.
export async function startServer(args, timeoutMs = 60000, model = MODEL) {
  const child = spawn(ARBITER, ["serve", "-m", model, "--port", "0", ...args], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("server did not print its port: " + stderr)), timeoutMs);
    child.stderr.on("data", (d) => {
      stderr += d;
      const m = stderr.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    child.on("exit", (code) => reject(new Error(`server exited early (${code}): ${stderr}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  while (true) {
    const r = await fetch(base + "/health").catch(() => null);
    if (r && r.status === 200) break;
    if (Date.now() - t0 > timeoutMs) throw new Error("server not ready: " + stderr);
    await new Promise((res) => setTimeout(res, 100));
  }
  return {
    base, child,
    stderr: () => stderr,
    async stop() {
      const code = await new Promise((resolve) => {
        const timer = setTimeout(() => { child.kill("SIGKILL"); resolve("hung: killed"); }, 60000);
        child.on("exit", (c, sig) => { clearTimeout(timer); resolve(c === null ? sig : c); });
        child.kill("SIGTERM");
      });
      return code;
    },
  };
}

// Reads an SSE response body: the parsed `data:` objects, and whether [DONE] ended it.
export async function readSse(res) {
  const text = await res.text();
  const events = [];
  let done = false;
  for (const block of text.split("\n\n")) {
    if (!block.startsWith("data: ")) continue;
    const d = block.slice(6);
    if (d === "[DONE]") { done = true; continue; }
    events.push(JSON.parse(d));
  }
  return { events, done };
}
