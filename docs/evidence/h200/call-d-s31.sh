#!/usr/bin/env bash
# Session 31, call D: the final binaries (the occupancy query of both GEMV kernels in one
# helper): test_cuda, the cuda tiers' op tests, and one bench of gemma3-1b (call C: 816 tok/s
# on an H100).
set -u
CARRY=.carry/b31d
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
timeout 100 $A bench --synth gemma3-1b --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-gemma3-1b.txt 2>&1
s "gemma3-1b rc=$? $(grep -E '^\| tg128' $R/bench-gemma3-1b.txt | tr -s ' ')"
