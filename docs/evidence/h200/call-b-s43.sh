#!/usr/bin/env bash
# Session 43, call B: ARBITER_EXP_QMMA_DEEP=1 (qmma-deep-s43.diff, an experiment switch): the
# tensor-core packed GEMV's Q4_K warps load two super-blocks ahead instead of one (three
# register sets; 95 -> 119-127 registers, still 2 blocks an SM), the first two before
# griddepcontrol.wait. Same arithmetic: w1/w8 traces of a synth Q4_K_M file must be identical;
# tg128 alternating. (Short: little device time was left.)
set -u
CARRY=.carry/b43b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-150}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
$A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 16 -q -o q06.gguf > $R/synth.log 2>&1
$A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 14 -q -o /tmp/q8b.gguf >> $R/synth.log 2>&1 &
SYN=$!
SHAPES="w1 w8" MODELS="q06.gguf" timeout 30 bash scripts/trace-identity.sh record $A $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
ARBITER_EXP_QMMA_DEEP=1 SHAPES="w1 w8" MODELS="q06.gguf" timeout 30 bash scripts/trace-identity.sh check $A \
  $R/ident.tsv > $R/ident-check.log 2>&1; s "identity deep rc=$? $(tail -1 $R/ident-check.log)"
bench() {  # tag file [env ...] [bench args]
  local tag=$1 f=$2; shift 2; local envs=(X=1)
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 12 ] || { s "skip $tag (time)"; return; }
  env "${envs[@]}" timeout 30 $A bench -m $f --device cuda --dtype bf16 "$@" > $R/bench-$tag.txt 2>&1
  s "$tag rc=$? $(grep -E '^\| tg' $R/bench-$tag.txt | tr -s ' ' | tr '\n' ' ')"
}
bench q06-base q06.gguf -p 512 -n 128 -r 2
bench q06-deep q06.gguf ARBITER_EXP_QMMA_DEEP=1 -p 512 -n 128 -r 2
wait $SYN; s "synth rc=$?"
for r in 1 2; do
  bench q8b-base-r$r /tmp/q8b.gguf -p 512 -n 128 -r 2
  bench q8b-deep-r$r /tmp/q8b.gguf ARBITER_EXP_QMMA_DEEP=1 -p 512 -n 128 -r 2
done
