#!/usr/bin/env bash
# Session 40, call A: measurements only, HEAD b6231e3 (session 39's call D, which never got a
# machine, plus qwen3-8b at depth 4096). gemma3-1b's decode attention with 2 and 4 query heads
# a block (ARBITER_CUDA_ATTN_HEADS_PER_BLOCK; 1, the default, beside them), and the presets'
# decode at --depth 4096 (issue 27's second fraction, KV bytes counted in the limit).
set -u
CARRY=.carry/b40a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-200}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
bench() {  # tag preset args... (env first)
  local tag=$1 p=$2; shift 2
  [ "$(left)" -gt 15 ] || { s "skip $tag $p (time)"; return; }
  env "$@" timeout 45 $A bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 \
    ${DEPTH:+--depth $DEPTH} > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
bench hpb1-1 gemma3-1b; bench hpb2 gemma3-1b ARBITER_CUDA_ATTN_HEADS_PER_BLOCK=2
bench hpb4 gemma3-1b ARBITER_CUDA_ATTN_HEADS_PER_BLOCK=4; bench hpb1-2 gemma3-1b
for p in qwen3-0.6b llama-3.2-1b gemma3-1b qwen3-8b; do DEPTH=4096 bench d4096 $p; done
