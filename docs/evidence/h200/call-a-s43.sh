#!/usr/bin/env bash
# Session 43, call A: the tensor-core packed GEMV (qmma_kernel), Q4_K and Q6_K in bf16, with an
# experiment switch (ARBITER_EXP_QMMA, not landed as such): 1 = Q4_K's kernel bounded to 3
# blocks an SM (80 registers) instead of 2; 2 = the MMAs of a super-block in independent
# chains (Q4_K: 4, Q6_K: 2; each column of D comes from one chain only, so the sums are the
# same bits); 3 = both (Q4_K: 2 chains); 4 = 3 blocks an SM for Q4_K and Q6_K. Op tests and
# w1/w8 trace identity under each, then tg128 of synth Q4_K_M files alternating over the five.
set -u
CARRY=.carry/b43a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
( $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o q06.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 100 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran' "$R/test_cuda.log" | tail -6 >> "$S"
for v in 3; do
  ARBITER_EXP_QMMA=$v timeout 60 $B/test_ops --gtest_filter='*cuda*' > "$R/ops-$v.log" 2>&1
  s "ops cuda V$v rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/ops-$v.log | head -3 | tr '\n' ' ')"
done
wait $SYN; s "synth rc=$? $(ls -la q06.gguf /tmp/q8b.gguf | awk '{print $5}' | tr '\n' ' ')"
SHAPES="w1 w8" MODELS="q06.gguf" timeout 60 bash scripts/trace-identity.sh record $A $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record V0 rc=$?"
for v in 1 2 3 4; do
  ARBITER_EXP_QMMA=$v SHAPES="w1 w8" MODELS="q06.gguf" timeout 60 bash scripts/trace-identity.sh check $A \
    $R/ident.tsv > $R/ident-check-$v.log 2>&1; s "identity V$v rc=$? $(tail -1 $R/ident-check-$v.log)"
done
bench() {  # tag file [bench args]
  local tag=$1 f=$2; shift 2
  [ "$(left)" -gt 30 ] || { s "skip $tag (time)"; return; }
  timeout 60 $A bench -m $f --device cuda --dtype bf16 "$@" > $R/bench-$tag.txt 2>&1
  s "$tag rc=$? $(grep -E '^\| (tg|pp)' $R/bench-$tag.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for v in 0 1 2 3 4; do ARBITER_EXP_QMMA=$v bench q8b-V$v-r$r /tmp/q8b.gguf -p 512 -n 128 -r 2; done
done
for v in 0 1 2 3 4; do ARBITER_EXP_QMMA=$v bench q06-V$v q06.gguf -p 512 -n 128 -r 2; done
for p in gemma3-1b nemotron-3-nano-30b-a3b; do
  [ "$(left)" -gt 60 ] || { s "skip $p (time)"; continue; }
  timeout $(( $(left) - 15 )) $A bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$p.txt 2>&1
  s "$p rc=$? $(grep -E '^\| tg128' $R/bench-$p.txt | tr -s ' ' | tr '\n' ' ')"
done
