#!/usr/bin/env bash
# Session 42, call A. arbiter: the decode attention templated on the query heads its lanes
# hold (G = 1 for a block of one head: no registers of a second; bf16/f16 at Dh 256 and f32
# at Dh 128 then keep two iterations of keys in flight); arbiter_old: 6643ce9. Both carry an
# experiment switch in StepGraph::submit (not committed) that skips, or runs twice, every
# launch of one signature tag: 24 decode attention, 20 norm GEMV (q/k/v, logits), 21 norm
# gate/up GEMV, 3 plain GEMV, 22 GEMV + residual add. Tests, trace identity, tg128
# alternating; where a gemma3-1b and a nemotron step go (each kernel class left out).
set -u
CARRY=.carry/b42a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
$A synth --preset gemma3-1b --dtype bf16 --layers 2 -o synth-g2 --quiet > $R/synth.log 2>&1; s "synth rc=$?"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-gemma2 synth-g2"
for dt in bf16 f32; do
  SHAPES="w1 w8" MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh record $B/arbiter_old $R/ident-$dt.tsv cuda:$dt \
    > $R/ident-record-$dt.log 2>&1; s "identity record $dt rc=$?"
  SHAPES="w1 w8" MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh check $A $R/ident-$dt.tsv > $R/ident-check-$dt.log 2>&1
  s "identity check $dt rc=$? $(tail -1 $R/ident-check-$dt.log)"
done
bench() {  # tag binary preset [env ...] [-- extra bench args]
  local tag=$1 bin=$2 p=$3; shift 3; local envs=(X=1)
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 30 ] || { s "skip $tag $p (time)"; return; }
  env "${envs[@]}" timeout 60 $B/$bin bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 "$@" \
    > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for p in gemma3-1b qwen3-0.6b llama-3.2-1b; do bench old$r arbiter_old $p; bench new$r arbiter $p; done
done
bench old-d4096 arbiter_old gemma3-1b --depth 4096; bench new-d4096 arbiter gemma3-1b --depth 4096
for t in 24 20 21 3 22; do bench skip$t arbiter gemma3-1b ARBITER_EXP_SKIP=$t; done
bench twice24 arbiter gemma3-1b ARBITER_EXP_TWICE=24
for p in qwen3-8b granite-4.0-h-1b granite-4.0-h-tiny nemotron-3-nano-30b-a3b qwen3-30b-a3b; do
  bench old arbiter_old $p; bench new arbiter $p
done
for t in 24 20 21 3 22; do bench skip$t arbiter nemotron-3-nano-30b-a3b ARBITER_EXP_SKIP=$t; done
