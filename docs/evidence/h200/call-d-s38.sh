#!/usr/bin/env bash
# Session 38, call D: what the NormAdd code in the register norm GEMV costs the models that do
# not use it. arbiter: the tree as it lands (call C's binary); arbiter_nopre: the same build
# with that code compiled out (gemv.cu: `constexpr bool pre = false;` and `hs[1]`; fused.cpp:
# pre_inside false, so gemma's NormAdd runs as cuda.rmsnorm_add before the norm GEMV). tg128,
# the binaries alternating. Not run: session 38's device time ran out before a machine came.
set -u
CARRY=.carry/b38d
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-200}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
bench() {  # binary preset round
  [ "$(left)" -gt 25 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 60 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2 3; do bench arbiter qwen3-0.6b $r; bench arbiter_nopre qwen3-0.6b $r; done
for r in 1 2; do bench arbiter_nopre llama-3.2-1b $r; bench arbiter llama-3.2-1b $r; done
bench arbiter gemma3-1b 1; bench arbiter_nopre gemma3-1b 1
bench arbiter qwen3-8b 1; bench arbiter_nopre qwen3-8b 1
