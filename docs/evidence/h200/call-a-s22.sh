#!/usr/bin/env bash
# Session 22, call A: CUDA op suite and test_cuda of 12b1d68, the 14-model H200 matrix (the
# retrained tiny-granite-h-moe), a post-fusion ncu profile of gemma3-1b's decode step, then
# clean bench rows while time remains. Everything comes back in one tarball.
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry -xJf .carry/bin12.tar.xz
B=$PWD/.carry/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 150 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops rc=$?"; grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/ops.log" | tail -30 >> "$S"
timeout 170 $B/test_cuda --gtest_filter='-CudaBench.*' > "$R/cuda.log" 2>&1; s "test_cuda rc=$?"; grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/cuda.log" | tail -30 >> "$S"
M=/tmp/h200-matrix; rm -rf $M
$A matrix plan matrix/h200.toml -o $M > "$R/matrix-plan.sh" 2> "$R/matrix-plan.log"
s "matrix: $(wc -l < "$R/matrix-plan.sh") traces, $(left) s left"
tr '\n' '\0' < "$R/matrix-plan.sh" | timeout 150 xargs -0 -P 16 -I{} bash -c '{} 2>/dev/null'
s "matrix traced rc=$?"
timeout 60 $A matrix report $M > "$R/matrix-report.log" 2>&1; s "matrix report rc=$?"
mkdir -p "$R/matrix"; cp $M/report.md $M/results.json "$R/matrix/" 2>/dev/null
grep -E "^answer|FAIL|INCONCLUSIVE|MISSING" "$R/matrix-report.log" | head -30 >> "$S"
# Where gemma3-1b's decode step goes after the fusions: isolated kernel times of one step
# of all 26 layers, against the step time bench measures.
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 3000 \
  $A bench --synth gemma3-1b --device cuda --dtype bf16 -p 8 -n 4 -r 1 --no-probes > $R/gemma.csv 2> $R/gemma-ncu.err
s "ncu gemma rc=$?"; python3 .carry/agg.py gemma3-1b $R/gemma.csv 40 > $R/gemma-step.txt 2>&1; head -24 $R/gemma-step.txt >> "$S"
row() { grep -E '^\| (pp|tg)|^model|decode  |state ' "$1" | tr -s ' ' >> "$S"; }
bench() {  # name, args...
  local n=$1; shift
  [ "$(left)" -gt 70 ] || { s "skip bench $n (time)"; return; }
  timeout $(( $(left) - 40 )) $A bench "$@" --device cuda --dtype bf16 -p 512 -n 128 -r 2 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; row "$R/bench-$n.txt"
}
bench gemma3-1b --synth gemma3-1b
ARBITER_CUDA_GRAPH=0 bench gemma3-1b-nograph --synth gemma3-1b
bench granite-4.0-h-1b --synth granite-4.0-h-1b
bench qwen3-30b-a3b --synth qwen3-30b-a3b
bench granite-4.0-h-tiny --synth granite-4.0-h-tiny
bench mixtral-8x7b --synth mixtral-8x7b
bench nemotron-3-nano-30b-a3b --synth nemotron-3-nano-30b-a3b
