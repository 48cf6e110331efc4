#!/usr/bin/env bash
# Session 44, call A, one binary: HEAD plus two experiment switches, both off unless set
# (qmma-deep-s43.diff: ARBITER_EXP_QMMA_DEEP=1, Q4_K's tensor-core GEMV warps load two
# super-blocks ahead; exp-switch-s42.diff: ARBITER_EXP_SKIP=TAG leaves every launch of one
# signature tag out of the step). 1) the decode fractions of issues 23, 24 and 27 at HEAD on
# whatever card came; 2) Q4_K deep loads: w1/w8 trace identity, then tg128 alternating;
# 3) where a granite-4.0-h-1b step goes (session 42's ablation for gemma3-1b, on a hybrid).
set -u
CARRY=.carry/b44a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-330}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
( $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o q06.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
$A synth --preset granite-4.0-h-1b --dtype bf16 --seed 0 -t 4 -q -o /tmp/gh1b.gguf >> $R/synth1.log 2>&1
s "synth h-1b rc=$?"
bench() {  # tag (--synth P | -m FILE) [env ...] [bench args]
  local tag=$1 how=$2 what=$3; shift 3; local envs=(X=1)
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 20 ] || { s "skip $tag (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 10 )) $A bench $how $what --device cuda --dtype bf16 "$@" \
    > $R/bench-$tag.txt 2>&1
  s "$tag rc=$? $(grep -E '^\| (tg|pp)' $R/bench-$tag.txt | tr -s ' ' | tr '\n' ' ')"
}
for p in gemma3-1b qwen3-0.6b llama-3.2-1b; do bench $p --synth $p -p 64 -n 128 -r 2; done
bench gemma3-1b-d4096 --synth gemma3-1b -p 64 -n 128 -r 2 --depth 4096
bench h1b -m /tmp/gh1b.gguf -p 64 -n 128 -r 2
for t in 20 21 22 3 24 31 32; do bench h1b-skip$t -m /tmp/gh1b.gguf ARBITER_EXP_SKIP=$t -p 64 -n 128 -r 2; done
wait $SYN; s "synth rc=$? $(ls -la q06.gguf /tmp/q8b.gguf | awk '{print $5}' | tr '\n' ' ')"
SHAPES="w1 w8" MODELS="q06.gguf" timeout 30 bash scripts/trace-identity.sh record $A $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
ARBITER_EXP_QMMA_DEEP=1 SHAPES="w1 w8" MODELS="q06.gguf" timeout 30 bash scripts/trace-identity.sh check $A \
  $R/ident.tsv > $R/ident-check.log 2>&1; s "identity deep rc=$? $(tail -1 $R/ident-check.log)"
for r in 1 2; do
  bench q8b-base-r$r -m /tmp/q8b.gguf -p 512 -n 128 -r 2
  bench q8b-deep-r$r -m /tmp/q8b.gguf ARBITER_EXP_QMMA_DEEP=1 -p 512 -n 128 -r 2
done
bench q06-base -m q06.gguf -p 512 -n 128 -r 2
bench q06-deep -m q06.gguf ARBITER_EXP_QMMA_DEEP=1 -p 512 -n 128 -r 2
bench h-tiny --synth granite-4.0-h-tiny -p 64 -n 128 -r 2
bench qwen3-8b --synth qwen3-8b -p 64 -n 128 -r 2
