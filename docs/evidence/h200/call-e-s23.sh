#!/usr/bin/env bash
# Session 23, call E: the packed tensor-core GEMV with x staged per block in shared memory and
# row pointers computed once per tile: CudaQuant.*, then Q4_K_M decode on qwen3-0.6b/qwen3-8b.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/d1 -xJf .carry/d1/bin.tar.xz
B=$PWD/.carry/d1/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; ls -la /tmp/*.gguf; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( [ -f /tmp/q06.gguf ] || $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q06.gguf
  [ -f /tmp/q8b.gguf ] || $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 120 $B/test_cuda --gtest_filter='CudaQuant.*' > "$R/cuda-quant.log" 2>&1; s "test_cuda CudaQuant rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[       OK|Failure' "$R/cuda-quant.log" | head -20 >> "$S"
grep -E 'matmul.packed (bf16|f16) .*q[46]_k' "$R/cuda-quant.log" | head -24 >> "$S"
wait $SYN; s "synth rc=$?"
bq() {  # name, env assignments..., then bench arguments
  local n=$1; shift; local envs=()
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bq q8b X=1 -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q06 X=1 -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q8b-w4 ARBITER_CUDA_QMMA_WARPS=4 -m /tmp/q8b.gguf -p 512 -n 128 -r 2
