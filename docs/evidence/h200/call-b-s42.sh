#!/usr/bin/env bash
# Session 42, call B. arbiter: the norm GEMVs fetch their norm weights (and the NormAdd's)
# into L1 before griddep_wait (gemv.cu prefetch_own); arbiter_old: 0d947c8 from the same
# build (so that the two share all but one object's fatbin: the carry must stay under 64 MB
# with the tree, and the test binaries did not fit beside them). w1/w8 cuda bf16 traces
# identical between the two (the arithmetic is unchanged); tg128 alternating.
set -u
CARRY=.carry/b42b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-190}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
$A synth --preset gemma3-1b --dtype bf16 --layers 2 -o synth-g2 --quiet > $R/synth.log 2>&1; s "synth rc=$?"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-gemma2 synth-g2"
SHAPES="w1 w8" MODELS="$IDM" timeout 40 bash scripts/trace-identity.sh record $B/arbiter_old $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES="w1 w8" MODELS="$IDM" timeout 40 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -1 $R/ident-check.log)"
bench() {  # tag binary preset [env ...] [extra bench args]
  local tag=$1 bin=$2 p=$3; shift 3; local envs=(X=1)
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 20 ] || { s "skip $tag $p (time)"; return; }
  env "${envs[@]}" timeout 40 $B/$bin bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 "$@" \
    > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for p in gemma3-1b qwen3-0.6b llama-3.2-1b; do bench old$r arbiter_old $p; bench new$r arbiter $p; done
done
for p in granite-4.0-h-1b; do bench old arbiter_old $p; bench new arbiter $p; done
