#!/usr/bin/env bash
# Session 32, call A: the MoE blocks' residual update inside the decode down GEMV (moe_add),
# Granite's shared expert as one fused gate/up GEMV, and the MoE norm inside the router's GEMV
# (rmsnorm_matmul keep_xn). test_cuda and the cuda tiers' op tests first; then arbiter_old
# (52c5bef, session 31's last code) and arbiter alternating on synth bf16 decode of the MoE
# presets; cuda bf16 w1 traces of the MoE fixtures from both binaries (the same bits?).
set -u
CARRY=.carry/b32a
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral tiny-granite-h-moe tiny-nemotron-h; do
  for b in arbiter_old arbiter; do
    timeout 60 $B/$b trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-$f-$b.tsv > /dev/null 2>&1
    s "trace $f $b rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$b.tsv) rows)"
  done
done
bench() {  # preset binary round
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for m in granite-4.0-h-tiny qwen3-30b-a3b nemotron-3-nano-30b-a3b; do
  bench $m arbiter_old 1; bench $m arbiter 1
done
for m in granite-4.0-h-tiny qwen3-30b-a3b; do
  bench $m arbiter 2; bench $m arbiter_old 2
done
