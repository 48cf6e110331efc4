#!/usr/bin/env bash
# Session 30, call D: the loop GEMV (rows too long for the register kernel) with 8 weight
# loads in flight per lane instead of 4, same accumulation order: arbiter_old (565da82) and
# arbiter (the change) alternate on synth bf16 decode of models whose down projection takes
# that kernel (gemma3-1b K 6,912, llama-3.2-1b 8,192, qwen3-8b 12,288), then cuda traces at
# w1 (the decode GEMVs) of gemma3-1b and llama-3.2-1b by both, whose data rows must match.
# test_cuda of the change first.
set -u
CARRY=.carry/b30e
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 170 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
for m in gemma3-1b llama-3.2-1b qwen3-8b; do
  for b in arbiter_old arbiter arbiter_old arbiter; do
    timeout 100 $B/$b bench --synth $m --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$m-$b.txt 2>&1
    s "$m $b rc=$? $(grep -E '^\| tg128' $R/bench-$m-$b.txt | tr -s ' ')"
  done
done
C=models/corpus/stories.txt
for m in gemma3-1b llama-3.2-1b; do
  $A synth --preset $m --dtype bf16 --seed 0 -t 12 -q -o /tmp/$m > /dev/null 2>&1
  for b in arbiter_old arbiter; do
    timeout 100 $B/$b trace -m /tmp/$m --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-$m-$b.tsv > /dev/null 2>&1
    s "trace $m $b rc=$? data rows sha $(grep -v '^#' $R/tr-$m-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$m-$b.tsv) rows)"
  done
  rm -rf /tmp/$m
done
