#!/usr/bin/env bash
# Session 37, call B: the register GEMV with the next rows' weights loaded while the current
# ones are multiplied (gemv.cu, kPipe), against the same tree without it (arbiter_old: HEAD
# bb3652a's gemv.cu; both with call A's MoE sort and conv tiles). The cuda op tests, test_cuda
# whole; w1 traces of every shipped and fixture model on cuda bf16 byte-identical between the
# two (scripts/trace-identity.sh); tg128 of the presets, the binaries alternating.
set -u
CARRY=.carry/b37b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 90 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 90 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-qwen3-moe"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh record $B/arbiter_old $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -3 $R/ident-check.log | tr '\n' ' ')"
bench() {  # binary preset round
  [ "$(left)" -gt 60 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 60 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for p in granite-4.0-h-1b gemma3-1b qwen3-0.6b; do
  bench arbiter $p 1; bench arbiter_old $p 1; bench arbiter $p 2; bench arbiter_old $p 2
done
for p in nemotron-3-nano-30b-a3b granite-4.0-h-tiny llama-3.2-1b qwen3-8b; do
  bench arbiter $p 1; bench arbiter_old $p 1
done
