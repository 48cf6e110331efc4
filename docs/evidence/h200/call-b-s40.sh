#!/usr/bin/env bash
# Session 40, call B: correctness of 60b849b on the GPU (the cuda op tests, with summarize's
# new rows of NaN and -Inf only and the Matmuls test, and test_cuda), then the presets'
# decode at depth 0 and --depth 4096 on whatever card came (call A's were on an H100).
set -u
CARRY=.carry/b40b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 120 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 120 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
bench() {  # tag preset (DEPTH from the environment)
  local tag=$1 p=$2
  [ "$(left)" -gt 30 ] || { s "skip $tag $p (time)"; return; }
  timeout 60 $A bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 \
    ${DEPTH:+--depth $DEPTH} > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
for p in qwen3-0.6b llama-3.2-1b gemma3-1b qwen3-8b; do bench d0 $p; DEPTH=4096 bench d4096 $p; done
