#!/usr/bin/env bash
# Session 39, call B: the tree as it lands (532fd38: the loop GEMV's first weights before the
# wait, the NormAdd as the PRE variant of the norm forms), arbiter, against arbiter_nopre
# (call A's: 996d01b with the NormAdd compiled out, the loop kernel as before). The cuda op
# tests and test_cuda; w1 cuda bf16 traces identical between the two; drift at width 1 on the
# gemma fixtures (every stage tapped: the NormAdd as its own op); tg128 of the presets,
# the binaries alternating.
set -u
CARRY=.carry/b39b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
$A synth --preset gemma3-1b --dtype bf16 --layers 2 -o synth-g2 --quiet > $R/synth.log 2>&1; s "synth rc=$?"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-gemma2 synth-g2"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh record $B/arbiter_nopre $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -1 $R/ident-check.log)"
for m in tiny-gemma3 tiny-gemma2; do
  timeout 60 $A drift -m tests/fixtures/models/$m --prompt "Once upon a time there was" --a ref \
    --b cuda:bf16 --width 1 > $R/drift-$m.txt 2>&1; s "drift $m w1 rc=$? $(tail -1 $R/drift-$m.txt)"
done
bench() {  # binary preset round
  [ "$(left)" -gt 40 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 60 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for p in qwen3-0.6b gemma3-1b llama-3.2-1b; do bench arbiter $p $r; bench arbiter_nopre $p $r; done
done
for p in granite-4.0-h-1b qwen3-8b qwen3-30b-a3b granite-4.0-h-tiny; do
  bench arbiter_nopre $p 1; bench arbiter $p 1
done
