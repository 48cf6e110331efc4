#!/usr/bin/env bash
# Session 24, call F: the final binaries (batched decode steps on the direct decode kernel,
# one norm launch for the logits rows, one summary for the greedy picks; the RMSNorm inside
# the tensor-core packed GEMV's launches): test_cuda whole, the op suite on the cuda tiers,
# bench --concurrency 1,8,64 -p 128 -n 64 on qwen3-0.6b and qwen3-8b bf16 GGUFs, and Q4_K_M
# decode with the norm inside (arbiter) and as its own op (arbiter-old: the binary of call D),
# on GGUFs left in /tmp for call G's llama.cpp.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/f -xJf .carry/f/bin.tar.xz
B=$PWD/.carry/f/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype bf16 --format gguf --seed 0 -t 12 -q -o /tmp/q06-bf16.gguf && \
  $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q06.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf && \
  $A synth --preset qwen3-8b --dtype bf16 --format gguf --seed 0 -t 12 -q -o /tmp/q8b-bf16.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
grep -E '^\[ batch' "$R/test_cuda.log" | grep -E 'cuda (bf16|f32), batch' >> "$S"
timeout 150 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|Failure' "$R/ops.log" | tail -8 >> "$S"
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, binary, then bench arguments
  local n=$1 bin=$2; shift 2
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  timeout $(( $(left) - 20 )) $bin bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\|' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -1 "$R/bench-$n.txt" | grep -i error >> "$S"
}
bq q06-q4km $A -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q06-q4km-old $B/arbiter-old -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q8b-q4km $A -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q8b-q4km-old $B/arbiter-old -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq conc-q06 $A -m /tmp/q06-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-q8b $A -m /tmp/q8b-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq single-q8b $A -m /tmp/q8b-bf16.gguf -p 512 -n 128 -r 2
