#!/usr/bin/env bash
# Session 23, call D1: the final binaries (tensor-core Q4_K/Q6_K GEMV, coalesced dequantization,
# the few-row GEMM of row-invariant batches): test_cuda whole; bench of the Q4_K_M GGUFs and
# of qwen3-0.6b bf16 (the files call D2's llama.cpp reads, left in /tmp); bench --concurrency
# with the few-row GEMM on and off (ARBITER_CUDA_FEWROW=0: cuBLASLt); ncu warp stall reasons
# of the packed GEMV.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/d1 -xJf .carry/d1/bin.tar.xz
B=$PWD/.carry/d1/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q06.gguf && \
  $A synth --preset qwen3-0.6b --dtype bf16 --format gguf --seed 0 -t 12 -q -o /tmp/q06-bf16.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 230 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran' "$R/test_cuda.log" | tail -12 >> "$S"
grep -E 'fewrow|^\[ batch' "$R/test_cuda.log" | head -12 >> "$S"
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, env assignments..., then bench arguments
  local n=$1; shift; local envs=()
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 60 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 30 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\|' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bq q06-q4km X=1 -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q8b-q4km X=1 -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q06-bf16 X=1 -m /tmp/q06-bf16.gguf -p 512 -n 128 -r 2
bq conc-q06-bf16 X=1 -m /tmp/q06-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-8b X=1 --synth qwen3-8b --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-q06-bf16-cublaslt ARBITER_CUDA_FEWROW=0 -m /tmp/q06-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-8b-cublaslt ARBITER_CUDA_FEWROW=0 --synth qwen3-8b --concurrency 1,8,64 -p 128 -n 64 -r 1
[ "$(left)" -gt 50 ] && { ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 15 )) ncu --clock-control none --kernel-name regex:qmma_kernel --launch-skip 300 --launch-count 3 \
  --section WarpStateStats --section SchedulerStats --section Occupancy \
  $A bench -m /tmp/q8b.gguf --device cuda --dtype bf16 -p 8 -n 4 -r 1 --no-probes > $R/qmma-stalls.txt 2>&1; s "ncu stalls rc=$?"; }
grep -E "qmma_kernel|Stall|Warp Cycles|Issued|Eligible|Achieved Occupancy|Theoretical Occupancy" $R/qmma-stalls.txt | head -40 >> "$S" 2>/dev/null
