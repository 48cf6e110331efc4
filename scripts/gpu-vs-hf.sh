#!/usr/bin/env bash
# H200 evidence that needs PyTorch, in one call: float64 w8 reference traces for the test
# fixtures (tools/hf_trace.py), then `arbiter bench` (cuda bf16) and HF transformers (eager and
# compiled, tools/hf_bench.py) on the SAME synthetic Qwen3-0.6B checkpoint, in the same run.
# Usage on the GPU machine, from the repo root, with prebuilt binaries (see gpu-check.sh):
#   ARBITER_PREBUILT=.carry/bin scripts/gpu-vs-hf.sh      # results under $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${ARBITER_PREBUILT:-build-gpu/src}
A=$BIN/arbiter
export LD_LIBRARY_PATH="$PWD/$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-out/gpu-vs-hf}
CORPUS=models/corpus/stories.txt
mkdir -p "$OUT/fx"

echo "== float64 w8 fixture traces (transformers, CPU)"
for m in models/TinyStories-656K tests/fixtures/models/tiny-llama tests/fixtures/models/tiny-mistral \
         tests/fixtures/models/tiny-qwen2 tests/fixtures/models/tiny-qwen3; do
  n=$(basename "$m")
  timeout 120 python3 tools/hf_trace.py -m "$m" --corpus "$CORPUS" --chunk 8 --chunks 8 \
    --prefill 64 --start 0 --topk 8 --dtype float64 --device cpu \
    -o "$OUT/fx/$n.w8.f64.tsv" >"$OUT/fx/$n.log" 2>&1 &
done
wait
tar czf "$OUT/fixtures.tgz" -C "$OUT" fx && rm -rf "$OUT/fx"

echo "== synth qwen3-0.6b (bf16)"
timeout 90 "$A" synth --preset qwen3-0.6b --dtype bf16 -o /tmp/q3 --force >"$OUT/synth.log" 2>&1
echo "== arbiter bench cuda bf16"
timeout 150 "$A" bench -m /tmp/q3 --device cuda --dtype bf16 -p 512 -n 128 -r 3 \
  --shapes w256 --corpus "$CORPUS" --json-out "$OUT/arbiter_bench.json" >"$OUT/arbiter_bench.txt" 2>&1
echo "bench rc=$?"; tail -25 "$OUT/arbiter_bench.txt"
echo "== HF transformers (eager, compile)"
PYTHONUNBUFFERED=1 timeout 240 python3 tools/hf_bench.py -m /tmp/q3 -r 3 --warmup 1 \
  >"$OUT/hf_bench.json" 2>"$OUT/hf_bench.err"
echo "hf rc=$?"; tail -5 "$OUT/hf_bench.err"
python3 - "$OUT/hf_bench.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("hf_bench.json unreadable:", e); sys.exit(0)
for mode, r in d.get("modes", d).items() if isinstance(d.get("modes", d), dict) else []:
    print(mode, {k: (v.get("median") if isinstance(v, dict) and "median" in v else v) for k, v in (r.items() if isinstance(r, dict) else [])})
PY
