#!/usr/bin/env bash
# Session 28, call A: tests of the committed work not yet run on a GPU (522ce80: a prefill's
# logits of its last token alone) and of the tensor-core GEMV keeping 128 + q in bf16 (no
# subtraction per pair, the offset taken out per group through the sums of x): `arbiter` folds
# Q4_K/Q5_K and Q6_K, `arbiter-k` Q4_K/Q5_K only, `arbiter-head` neither (a0d398f); bench of
# the three (Q4_K_M), ncu kernel times of one decode step (qwen3-8b Q4_K_M new, qwen3-30b-a3b
# bf16), HF transformers' compile on qwen3-0.6b with arbiter in the same call.
set -u
cd "$(dirname "$0")/../../.."
T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/a28 -xJf .carry/a28/bin.tar.xz
B=$PWD/.carry/a28/stage; A=$B/arbiter; OLD=$B/arbiter-head
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q06.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf && \
  $A synth --preset qwen3-0.6b --dtype bf16 --seed 0 -t 12 -q -o /tmp/q3 ) > $R/synth.log 2>&1 &
SYN=$!
timeout 150 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
timeout 100 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|Failure' "$R/ops.log" | tail -8 >> "$S"
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, binary, then bench arguments
  local n=$1 bin=$2; shift 2
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  timeout $(( $(left) - 20 )) $bin bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -1 "$R/bench-$n.txt" | grep -i error >> "$S"
}
bq q8b-new $A -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q8b-old $OLD -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q8b-k $B/arbiter-k -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q06-new $A -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q06-old $OLD -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q06-k $B/arbiter-k -m /tmp/q06.gguf -p 512 -n 128 -r 2
nq() {  # name, metrics, then bench arguments: ncu kernel times of one decode step
  local n=$1 m=$2; shift 2
  [ "$(left)" -gt 70 ] || { s "skip ncu $n (time)"; return; }
  ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 40 )) ncu --clock-control none --metrics $m --csv --print-units base \
    $A bench "$@" --device cuda --dtype bf16 --no-probes > "$R/ncu-$n.csv" 2> "$R/ncu-$n.err"
  s "ncu $n rc=$?"; python3 docs/evidence/h200/call-a-s26-agg.py "$R/ncu-$n.csv" >> "$S" 2>&1
}
nq q8b-new gpu__time_duration.sum,dram__bytes_read.sum -m /tmp/q8b.gguf -p 8 -n 2 -r 1
nq q30 gpu__time_duration.sum --synth qwen3-30b-a3b -p 8 -n 2 -r 1
bq q3-new $A -m /tmp/q3 -p 512 -n 128 -r 2
[ "$(left)" -gt 90 ] && { timeout $(( $(left) - 15 )) python3 tools/hf_bench.py -m /tmp/q3 --modes compile -r 3 --warmup 1 > $R/hf_bench.json 2> $R/hf_bench.err; s "hf_bench rc=$?"; cat $R/hf_bench.json >> "$S"; tail -3 $R/hf_bench.err >> "$S"; }
