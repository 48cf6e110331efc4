#!/usr/bin/env bash
# Session 35, call B. Call A measured the Mamba2 layer with both fusions slower; the gated
# norm inside out_proj's GEMV (docs/evidence/h200/gated-norm-out-proj-s35.diff) was taken out,
# and this binary keeps the conv inside the in_proj GEMV alone. Its cuda op tests (the conv
# fusion, the conv) and test_cuda whole; then ARBITER_CUDA_SSM_FUSED=0 (GEMV, then ssm_conv)
# and 1 (one launch) alternating on the hybrids' decode; then, as time allows, two dense
# presets for the record.
set -u
CARRY=.carry/b35b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*RmsnormMatmul*cuda*:*SsmConv*cuda*' \
  > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
bench() {  # preset SSM_FUSED round
  [ "$(left)" -gt 40 ] || { s "skip $1 $2 #$3 (time)"; return; }
  ARBITER_CUDA_SSM_FUSED=$2 timeout 100 $A bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 SSM_FUSED=$2 #$3 rc=$? $(grep -E '^\| (tg128|pp512)' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do bench granite-4.0-h-1b 0 $r; bench granite-4.0-h-1b 1 $r; done
bench granite-4.0-h-tiny 1 1; bench granite-4.0-h-tiny 0 1
bench granite-4.0-h-tiny 0 2; bench granite-4.0-h-tiny 1 2
bench nemotron-3-nano-30b-a3b 1 1; bench nemotron-3-nano-30b-a3b 0 1
bench qwen3-0.6b 1 1; bench gemma3-1b 1 1
