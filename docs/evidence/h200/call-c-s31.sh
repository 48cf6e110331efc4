#!/usr/bin/env bash
# Session 31, call C: the register GEMV with an NCH of 6 for rows of five or six 16-byte
# chunks a lane (gemma3-1b's 1,152 elements, granite-4.0-h-1b's 1,536), which took NCH 8
# (the gate/up form 180 registers, one block an SM) and now fit 128 registers (two blocks).
# arbiter_old (415e097) and arbiter alternate on synth bf16 decode of both; w1 cuda traces by
# both, whose data rows must match (zero chunks added nothing). test_cuda and the cuda tiers'
# op tests first.
set -u
CARRY=.carry/b31c
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
for m in gemma3-1b granite-4.0-h-1b; do
  for b in arbiter_old arbiter arbiter_old arbiter; do
    timeout 100 $B/$b bench --synth $m --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$m-$b.txt 2>&1
    s "$m $b rc=$? $(grep -E '^\| tg128' $R/bench-$m-$b.txt | tr -s ' ')"
  done
done
C=models/corpus/stories.txt
for m in gemma3-1b granite-4.0-h-1b; do
  $A synth --preset $m --dtype bf16 --seed 0 -t 12 -q -o /tmp/$m > /dev/null 2>&1
  for b in arbiter_old arbiter; do
    timeout 100 $B/$b trace -m /tmp/$m --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-$m-$b.tsv > /dev/null 2>&1
    s "trace $m $b rc=$? data rows sha $(grep -v '^#' $R/tr-$m-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$m-$b.tsv) rows)"
  done
  rm -rf /tmp/$m
done
