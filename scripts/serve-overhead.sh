#!/usr/bin/env bash
# The HTTP and scheduling overhead of `arbiter serve` (issue 30): time to first token and
# single-stream decode tok/s through the server's streaming /v1/completions, next to
# `arbiter bench` on the same model, device and sizes in the same run.
#
#   scripts/serve-overhead.sh ARBITER MODEL [DEVICE] [DTYPE] [P] [N] [R]
#   e.g. on the H200:  scripts/serve-overhead.sh build/src/arbiter /tmp/q3 cuda bf16 512 128 5
#
# P prompt tokens (ids 100.., so no tokenizer enters the timing), N generated tokens, R runs
# (medians). TTFT through the server counts from sending the request to the first streamed
# token; decode tok/s is (tokens - 1) / (last token - first token). Output: one table on
# stdout. Loopback only; the server is stopped at the end.
set -euo pipefail
A=${1:?ARBITER}; M=${2:?MODEL}; DEV=${3:-cpu}; DT=${4:-}; P=${5:-128}; N=${6:-64}; R=${7:-5}
dt=(); [ -n "$DT" ] && dt=(--dtype "$DT")
work=$(mktemp -d); trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

# Two bench runs, so that each number is measured as the server meets it: the prefill from an
# empty cache (time to first token), and the decode behind the P prompt tokens (--depth P).
"$A" bench -m "$M" --device "$DEV" "${dt[@]}" -p "$P" -n "$N" -r "$R" --no-probes --json-out "$work/bench.json" >/dev/null
"$A" bench -m "$M" --device "$DEV" "${dt[@]}" -p "$P" -n "$N" -r "$R" --depth "$P" --no-probes \
  --json-out "$work/bench-depth.json" >/dev/null
"$A" serve -m "$M" --device "$DEV" "${dt[@]}" --port 0 --ctx $((P + N + 8)) 2>"$work/serve.log" &
pid=$!
for _ in $(seq 600); do grep -q "\[serve\] ready" "$work/serve.log" && break; sleep 0.2; done
port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/serve.log" | grep -o '[0-9]*$')

python3 - "$port" "$P" "$N" "$R" "$work/bench.json" "$work/bench-depth.json" <<'EOF'
import http.client, json, statistics, sys, time
port, P, N, R, bench_path, depth_path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
body = json.dumps({"prompt": list(range(100, 100 + P)), "max_tokens": N, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}})
ttft, tps = [], []
for r in range(R + 1):  # the first run warms up
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    res = c.getresponse()
    times, tokens = [], 0
    for line in res:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0].get("finish_reason") is None:
            times.append(time.perf_counter())
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    c.close()
    if r == 0 or len(times) < 2:
        continue
    ttft.append((times[0] - t0) * 1e3)
    tps.append((tokens - 1) / (times[-1] - times[0]))
b = json.load(open(bench_path))
b_ttft, b_tps = b["first_token_ms"]["median"], json.load(open(depth_path))["tg"]["tok_s"]["median"]
s_ttft, s_tps = statistics.median(ttft), statistics.median(tps)
print(f"# {b['model']['path']} on {b['device']['name']} {b['device']['compute']}: P={P} N={N}, medians of {R} runs")
print(f"{'':24}{'bench':>12}{'serve':>12}{'overhead':>10}")
print(f"{'time to first token ms':24}{b_ttft:12.2f}{s_ttft:12.2f}{(s_ttft / b_ttft - 1) * 100:9.1f}%")
print(f"{'decode tok/s, depth P':24}{b_tps:12.1f}{s_tps:12.1f}{(1 - s_tps / b_tps) * 100:9.1f}%")
EOF
