#!/usr/bin/env bash
# Session 22, call E: batched forwards replayed as CUDA graphs, and the MoE down projection in
# blocks of 8 / k rows: test_ops (cuda), test_cuda, bench --concurrency with graphs (and one
# level set without), then mixtral-8x7b's decode (k = 2, the changed blocks).
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry -xJf .carry/bin16.tar.xz
B=$PWD/.carry/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 60 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops rc=$?"; grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/ops.log" | tail -8 >> "$S"
timeout 100 $B/test_cuda --gtest_filter='-CudaBench.*' > "$R/cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[ batch' "$R/cuda.log" | head -30 >> "$S"
bench() {  # name, args...
  local n=$1; shift
  [ "$(left)" -gt 40 ] || { s "skip bench $n (time)"; return; }
  timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| [0-9]|^\| (pp|tg)|decode  ' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bench conc-qwen3-0.6b --synth qwen3-0.6b --concurrency 1,8,64 -p 128 -n 64 -r 1
ARBITER_CUDA_GRAPH=0 bench conc-qwen3-0.6b-nograph --synth qwen3-0.6b --concurrency 1,8,64 -p 128 -n 64 -r 1
bench conc-qwen3-8b --synth qwen3-8b --concurrency 1,8,64 -p 128 -n 64 -r 1
bench mixtral-8x7b --synth mixtral-8x7b -p 64 -n 128 -r 2
