#!/usr/bin/env bash
# Session 24, call B: batched decode steps on the direct decode kernel (paged.cpp; a block per
# query head in this build), one norm launch for the logits rows, one summary for the greedy
# picks: test_cuda whole, the op suite's paged/batched attention on the cuda tiers, then bench
# --concurrency 1,8,64 -p 128 -n 64 on qwen3-0.6b and qwen3-8b bf16 GGUFs (left in /tmp for
# call C's llama.cpp), and qwen3-8b at 64 streams with 4 query heads per attention block and
# on the flash kernel.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/b -xJf .carry/b/bin.tar.xz
B=$PWD/.carry/b/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype bf16 --format gguf --seed 0 -t 12 -q -o /tmp/q06-bf16.gguf && \
  $A synth --preset qwen3-8b --dtype bf16 --format gguf --seed 0 -t 12 -q -o /tmp/q8b-bf16.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
grep -E '^\[ batch' "$R/test_cuda.log" | grep -E 'cuda (bf16|f32), batch|graphs' >> "$S"
timeout 100 $B/test_ops --gtest_filter='*AttentionBatch*:*PagedKv*:*Attention*cuda*' > "$R/ops.log" 2>&1; s "ops attention rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|Failure' "$R/ops.log" | tail -8 >> "$S"
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, env assignments..., then bench arguments
  local n=$1; shift; local envs=()
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\|' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -1 "$R/bench-$n.txt" | grep -i error >> "$S"
}
bq conc-q06 X=1 -m /tmp/q06-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-q8b X=1 -m /tmp/q8b-bf16.gguf --concurrency 1,8,64 -p 128 -n 64 -r 1
bq conc-q8b-hpb4 ARBITER_CUDA_ATTN_HEADS_PER_BLOCK=4 -m /tmp/q8b-bf16.gguf --concurrency 64 -p 128 -n 64 -r 1
bq conc-q8b-flash ARBITER_CUDA_ATTN_DIRECT=0 -m /tmp/q8b-bf16.gguf --concurrency 64 -p 128 -n 64 -r 1
