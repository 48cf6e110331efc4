#!/usr/bin/env bash
# Session 44, call B, call A's binary (1d13b11 + exp-switch-s42.diff, ARBITER_EXP_SKIP=TAG):
# where a granite-4.0-h-tiny step (MoE hybrid, shared expert) goes. Each tag's launches left
# out of the step in turn, tg128 of one synth file.
set -u
CARRY=.carry/b44a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-200}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
$A synth --preset granite-4.0-h-tiny --dtype bf16 --seed 0 -t 14 -q -o /tmp/ght.gguf > $R/synth.log 2>&1
s "synth h-tiny rc=$?"
bench() {  # tag [env ...]
  local tag=$1; shift; local envs=(X=1)
  while [ $# -gt 0 ] && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 15 ] || { s "skip $tag (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 5 )) $A bench -m /tmp/ght.gguf --device cuda --dtype bf16 -p 64 -n 128 -r 2 \
    > $R/bench-$tag.txt 2>&1
  s "$tag rc=$? $(grep -E '^\| tg' $R/bench-$tag.txt | tr -s ' ' | tr '\n' ' ')"
}
bench htiny
for t in 20 21 22 24 31 32 44 45 46 47; do bench htiny-skip$t ARBITER_EXP_SKIP=$t; done
