#!/usr/bin/env bash
# Session 28, call B: the binaries of HEAD (the fold of call A reverted): test_cuda with the CLI
# in place (call A's five CLI tests found no build-cuda/src/arbiter), then arbiter bench and HF
# transformers (tools/hf_bench.py, the prefill's logits_to_keep=1 of a0d398f) on one synth
# qwen3-0.6b bf16 checkpoint in the same call.
set -u
cd "$(dirname "$0")/../../.."
T0=$(date +%s); LIMIT=${LIMIT:-150}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/b28 -xJf .carry/b28/bin.tar.xz
B=$PWD/.carry/b28/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
$A synth --preset qwen3-0.6b --dtype bf16 --seed 0 -t 12 -q -o /tmp/q3 > $R/synth.log 2>&1 &
SYN=$!
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
wait $SYN; s "synth rc=$?"
timeout 120 $A bench -m /tmp/q3 -p 512 -n 128 -r 2 --device cuda --dtype bf16 > $R/bench-q3.txt 2>&1; s "bench q3 rc=$?"
grep -E '^\| (pp|tg)' $R/bench-q3.txt | tr -s ' ' >> "$S"
[ "$(left)" -gt 100 ] && timeout $(( $(left) - 30 )) python3 tools/hf_bench.py -m /tmp/q3 --modes compile -r 2 --warmup 1 > $R/hf_bench.json 2> $R/hf_bench.err; s "hf_bench rc=$?"
cat $R/hf_bench.json >> "$S"; tail -3 $R/hf_bench.err >> "$S"
