#!/usr/bin/env bash
# Session 33, call E: the fused-decode tests after their shared helper
# (expect_fused_op_keeps_bits): test_cuda's CudaFused tests on the final code.
set -u
CARRY=.carry/b33e
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda --gtest_filter='CudaFused*' > "$R/test_cuda.log" 2>&1; s "test_cuda CudaFused rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[       OK|tests ran|Failure' "$R/test_cuda.log" | tail -14 >> "$S"
