#!/usr/bin/env bash
# Session 32, call C (a diagnostic, not landed): how much of a graph-replayed MoE decode step
# the routing kernel costs. arbiter_fastroute is this session's binary with moe_route_kernel
# reduced to writing experts 0..k-1 with weights 1/k (wrong routes, the same bytes read: k
# experts a token); it alternates with the real binary on synth bf16 decode.
set -u
CARRY=.carry/b32c
source "$(dirname "$0")/call-common.sh"
bench() {  # preset binary round
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for m in granite-4.0-h-tiny qwen3-30b-a3b; do
  bench $m arbiter 1; bench $m arbiter_fastroute 1
done
bench granite-4.0-h-tiny arbiter_fastroute 2; bench granite-4.0-h-tiny arbiter 2
