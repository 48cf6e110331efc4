#!/usr/bin/env bash
# The GPU acceptance evidence of the correctness tools, in one call on a GPU machine:
#   1. the H200 correctness matrix (matrix/h200.toml), traced in parallel from `matrix plan`
#      and judged by `matrix report`;
#   2. the localisation ladder on the shipped model: gate ref,cpu,cuda:bf16; drift
#      cuda:bf16 vs ref; opcheck cuda bf16 and f32;
#   3. the --mix ablation: cuda bf16 traces with one op family at f32, each compared with ref.
# Everything goes under $OUT (logs, the matrix directory without its traces, reports).
# Usage, from the repository root (binaries built elsewhere, see gpu-check.sh):
#   ARBITER_PREBUILT=.carry/bin scripts/gpu-evidence.sh
# Env: OUT (default out/gpu-evidence), JOBS (parallel traces, default nproc).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${ARBITER_PREBUILT:-build-gpu/src}
A="$PWD/$BIN/arbiter"
export LD_LIBRARY_PATH="$PWD/$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-out/gpu-evidence}
JOBS=${JOBS:-$(nproc)}
MODEL=models/TinyStories-656K
CORPUS=models/corpus/stories.txt
mkdir -p "$OUT"
step() { echo "== $* ($(date -u +%T))"; }

step "matrix: plan, $JOBS traces at a time, report"
M=/tmp/h200-matrix
rm -rf "$M"
"$A" matrix plan matrix/h200.toml -o "$M" >"$OUT/matrix-plan.sh" 2>"$OUT/matrix-plan.log"
echo "$(wc -l <"$OUT/matrix-plan.sh") trace commands"
# Each line is a self-contained shell command; run them JOBS at a time.
tr '\n' '\0' <"$OUT/matrix-plan.sh" | xargs -0 -P "$JOBS" -I{} bash -c '{} 2>/dev/null'
"$A" matrix report "$M" >"$OUT/matrix-report.log" 2>&1
echo "matrix report exit code $?" | tee -a "$OUT/matrix-report.log"
mkdir -p "$OUT/matrix"
cp "$M"/report.md "$M"/report.html "$M"/results.json "$OUT/matrix/" 2>/dev/null
cp "$M"/traces/METADATA.txt "$M"/traces/RUNS.txt "$M"/traces/SHA256SUMS "$OUT/matrix/" 2>/dev/null

step "gate ref,cpu,cuda:bf16"
"$A" gate -m "$MODEL" --prompts tests/localize/prompts.txt -n 48 --runs 2 \
  --sides ref,cpu,cuda:bf16 >"$OUT/gate.txt" 2>"$OUT/gate.log"
echo "gate exit code $?" >>"$OUT/gate.txt"

step "drift cuda:bf16 vs ref"
"$A" drift -m "$MODEL" --corpus "$CORPUS" --a ref --b cuda:bf16 --tsv "$OUT/drift.tsv" \
  --svg "$OUT/drift.svg" >"$OUT/drift.txt" 2>"$OUT/drift.log"
echo "drift exit code $?" >>"$OUT/drift.txt"

for dt in bf16 f32; do
  step "opcheck cuda $dt"
  "$A" opcheck -m "$MODEL" --device cuda --dtype "$dt" >"$OUT/opcheck-$dt.txt" 2>"$OUT/opcheck-$dt.log"
  echo "opcheck exit code $?" >>"$OUT/opcheck-$dt.txt"
done

step "--mix ablation (w8, cuda bf16 with one family at f32, against ref)"
T=/tmp/mix-traces
mkdir -p "$T"
"$A" trace -m "$MODEL" --corpus "$CORPUS" --shape w8 --allow-long-context --device ref -o "$T/ref.tsv" --quiet
: >"$OUT/mix.txt"
for mix in none attn=f32 mlp=f32 norm=f32 logits=f32 attn=f32,mlp=f32,norm=f32,residual=f32,embed=f32,logits=f32; do
  args=(); [ "$mix" != none ] && args=(--mix "$mix")
  "$A" trace -m "$MODEL" --corpus "$CORPUS" --shape w8 --allow-long-context --device cuda --dtype bf16 "${args[@]}" \
    -o "$T/mix.tsv" --quiet 2>>"$OUT/mix.log"
  "$A" compare "$T/ref.tsv" "$T/mix.tsv" --json >"$T/c.json" 2>>"$OUT/mix.log"
  python3 - "$mix" "$T/c.json" >>"$OUT/mix.txt" <<'EOF'
import json, sys
j = json.load(open(sys.argv[2]))
d, t, g = j["top1_logit_delta"]["abs"], j["top1"], j["drift_gate"]
print("%-60s %-5s decided disagree %s/%s  |dlogit| p50 %.3g p99 %.3g max %.3g  KL %.3g (%.3g u^2)" % (
    sys.argv[1], j["verdict"], t["decided_disagree"], t["decided"], d["p50"], d["p99"], d["max"],
    j["kl"]["mean"]["mean"], g.get("kl_over_u2", float("nan"))))
EOF
done
cat "$OUT/mix.txt"
step done
