#!/usr/bin/env bash
# Session 38, call C: the tree as it lands. arbiter: Gemma's post norms inside the next norm's
# GEMV with the o/down GEMVs' epilogue removed, and the hybrids' decode scan loading its state
# row before the wait (ssm.cu); arbiter_rm: the same build without the scan change. The cuda op
# tests and test_cuda whole; w1 cuda bf16 traces of the hybrid, gemma and shipped models
# byte-identical between the two (scripts/trace-identity.sh); tg128 of the hybrids, the
# binaries alternating, and of the other presets once.
set -u
CARRY=.carry/b38c
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-330}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-granite-h-moe tests/fixtures/models/tiny-nemotron-h tests/fixtures/models/tiny-gemma3"
SHAPES="w1 w8" MODELS="$IDM" timeout 90 bash scripts/trace-identity.sh record $B/arbiter_rm $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES="w1 w8" MODELS="$IDM" timeout 90 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -3 $R/ident-check.log | tr '\n' ' ')"
bench() {  # binary preset round
  [ "$(left)" -gt 40 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 60 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do bench arbiter granite-4.0-h-1b $r; bench arbiter_rm granite-4.0-h-1b $r; done
for p in granite-4.0-h-tiny nemotron-3-nano-30b-a3b; do bench arbiter $p 1; bench arbiter_rm $p 1; done
for p in gemma3-1b qwen3-0.6b llama-3.2-1b qwen3-8b qwen3-30b-a3b; do bench arbiter $p 1; done
