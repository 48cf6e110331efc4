#!/usr/bin/env bash
# Session 39, call C (run inline as /tmp/c.sh from the repository root, on the machine call B
# held, with call B's binaries): the granite-4.0-h-1b pair again, three rounds (call B had it
# once, -3%), and the two 30B presets with a 120 s timeout (call B's 60 s cut qwen3-30b-a3b's
# second synth + bench).
set -u
CARRY=.carry/b39b
source docs/evidence/h200/call-common.sh
bench() { timeout 120 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"; }
for r in 1 2 3; do bench arbiter granite-4.0-h-1b $r; bench arbiter_nopre granite-4.0-h-1b $r; done
bench arbiter qwen3-30b-a3b 1; bench arbiter nemotron-3-nano-30b-a3b 1
