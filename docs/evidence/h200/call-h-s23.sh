#!/usr/bin/env bash
# Session 23, call H: the tensor-core packed GEMV reading Q5_K too: CudaQuant.* and the op
# suite's packed matmul/embed cases on the cuda tiers, then Q5_K_M decode on qwen3-0.6b and
# qwen3-8b synth GGUFs with the kernel on and off.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-230}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/d1 -xJf .carry/d1/bin.tar.xz
B=$PWD/.carry/d1/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype q5_k_m --seed 0 -t 14 -q -o /tmp/q06-q5.gguf && \
  $A synth --preset qwen3-8b --dtype q5_k_m --seed 0 -t 14 -q -o /tmp/q8b-q5.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 100 $B/test_cuda --gtest_filter='CudaQuant.*' > "$R/cuda-quant.log" 2>&1; s "test_cuda CudaQuant rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[       OK|Failure' "$R/cuda-quant.log" | head -20 >> "$S"
grep -E 'matmul.packed (bf16|f16) .*q5_k' "$R/cuda-quant.log" | head -12 >> "$S"
timeout 60 $B/test_ops --gtest_filter='*Matmul*cuda*:*Embed*cuda*' > "$R/ops.log" 2>&1; s "ops matmul/embed rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/ops.log" | tail -8 >> "$S"
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, env assignments..., then bench arguments
  local n=$1; shift; local envs=()
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 25 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 10 )) $A bench "$@" --device cuda --dtype bf16 -p 512 -n 128 -r 2 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bq q8b-q5 X=1 -m /tmp/q8b-q5.gguf
bq q06-q5 X=1 -m /tmp/q06-q5.gguf
bq q8b-q5-fma ARBITER_CUDA_QGEMV_MMA=0 -m /tmp/q8b-q5.gguf
bq q06-q5-fma ARBITER_CUDA_QGEMV_MMA=0 -m /tmp/q06-q5.gguf
