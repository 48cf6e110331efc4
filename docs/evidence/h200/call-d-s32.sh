#!/usr/bin/env bash
# Session 32, call D: the routing kernel with the experts in registers, the top-k rounds
# without shared memory and the weights a lane per pick (moe.cu; measured slower, not landed:
# the change: route-regs-s32.diff). The cuda op tests of moe
# (ids and margins equal to ref's, ties and near-ties, groups) and test_cuda's MoE and fused
# tests; cuda bf16 w1 traces of the MoE fixtures from arbiter_prev (this session's binary
# before the change: calls A-C) and arbiter; then the two alternating on synth bf16 decode.
set -u
CARRY=.carry/b32d
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral tiny-granite-h-moe tiny-nemotron-h; do
  for sh in w1 w8; do for b in arbiter_prev arbiter; do
    timeout 60 $B/$b trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape $sh --corpus $C -o $R/tr-$f-$sh-$b.tsv > /dev/null 2>&1
    s "trace $sh $f $b rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$sh-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$sh-$b.tsv) rows)"
  done; done
done
bench() {  # preset binary round
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for m in granite-4.0-h-tiny qwen3-30b-a3b nemotron-3-nano-30b-a3b; do
  bench $m arbiter_prev 1; bench $m arbiter 1
done
bench granite-4.0-h-tiny arbiter 2; bench granite-4.0-h-tiny arbiter_prev 2
