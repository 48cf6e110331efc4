#!/usr/bin/env bash
# Session 22, call C: the MoE decode kernels (gate/up rows in one pass, a warp per slot's down
# row) and the changed tests: op suite (cuda), test_cuda, then decode benches of the MoE and
# hybrid presets and qwen3-8b's single-stream decode (the reference of the batching numbers).
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-480}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry -xJf .carry/bin14.tar.xz
B=$PWD/.carry/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 90 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops rc=$?"; grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/ops.log" | tail -20 >> "$S"
timeout 150 $B/test_cuda --gtest_filter='-CudaBench.*' > "$R/cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|granite-h-moe' "$R/cuda.log" | head -20 >> "$S"
bench() {  # name, args...
  local n=$1; shift
  [ "$(left)" -gt 50 ] || { s "skip bench $n (time)"; return; }
  timeout $(( $(left) - 25 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)|^model|decode  ' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bench qwen3-30b-a3b --synth qwen3-30b-a3b -p 512 -n 128 -r 2
bench granite-4.0-h-tiny --synth granite-4.0-h-tiny -p 512 -n 128 -r 2
bench qwen3-8b --synth qwen3-8b -p 128 -n 64 -r 2
bench nemotron-3-nano-30b-a3b --synth nemotron-3-nano-30b-a3b -p 512 -n 128 -r 2
bench mixtral-8x7b --synth mixtral-8x7b -p 512 -n 128 -r 2
