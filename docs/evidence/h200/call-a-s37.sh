#!/usr/bin/env bash
# Session 37, call A: the hybrids' and MoE models' prefill after session 36's call A profile.
# The binaries hold (against HEAD bb3652a) the scan's batched staging (each thread loads 8
# values before storing any; chunk_out stages x_s in shared memory, tokens of m[t, s] 128 at a
# time; the conv's tiles 16 tokens) and the MoE sort in parallel (a warp per segment of the
# pairs, match_any per expert; session 36's thread per expert scanning every pair took 274 us
# of a Nemotron MoE layer). The cuda op tests of the Mamba2 and MoE ops, test_cuda whole; cuda
# f32/bf16 w8/w256 traces of the hybrid and MoE fixtures against ref; Nsight Compute of 4-layer
# pp512s (call-a-s36-agg.py); pp512/tg128 of the presets. Session 36's call A (an H200, HEAD
# 4741b9b) is the before.
set -u
CARRY=.carry/b37a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-420}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_ops \
  --gtest_filter='*RmsnormMatmul*cuda*:*SsmConv*cuda*:*SsmScan*cuda*:*RmsnormGated*cuda*:*Moe*cuda*' \
  > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-granite-h tiny-granite-h-moe tiny-nemotron-h tiny-qwen3-moe; do
  for sh in w8 w256; do
    $A trace -m tests/fixtures/models/$f --device ref --shape $sh --corpus $C -o $R/tr-$f-$sh-ref.tsv > /dev/null 2>&1
    for dt in f32 bf16; do
      t=$R/tr-$f-$sh-$dt.tsv
      timeout 60 $A trace -m tests/fixtures/models/$f --device cuda --dtype $dt --shape $sh --corpus $C -o $t > /dev/null 2>&1
      $A compare $R/tr-$f-$sh-ref.tsv $t > $t.cmp 2>&1; rc=$?
      s "$f $sh $dt compare rc=$rc $(grep -E '^  \|delta\|' $t.cmp | tr -s ' ' | cut -c1-60) $(grep -oE 'KL/u\^2 [0-9.e+-]+' $t.cmp) $(grep -oE ': (pass|FAIL)' $t.cmp | tr '\n' ' ')"
    done
  done
done
bench() {  # preset round
  [ "$(left)" -gt 70 ] || { s "skip $1 #$2 (time)"; return; }
  timeout 100 $A bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2.txt 2>&1
  s "$1 #$2 rc=$? $(grep -E '^\| (pp512|tg128)' $R/bench-$1-$2.txt | tr -s ' ' | tr '\n' ' ')"
}
bench granite-4.0-h-1b 1; bench qwen3-30b-a3b 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in granite-4.0-h-1b nemotron-3-nano-30b-a3b; do  # nemotron's first 4: M, E, M, E
  [ "$(left)" -gt 150 ] || { s "skip ncu $m (time)"; continue; }
  ARBITER_CUDA_GRAPH=0 timeout 60 $NCU --clock-control none --metrics gpu__time_duration.sum \
    --csv --log-file $R/ncu-pp-$m.csv $A bench --synth $m --synth-layers 4 --device cuda \
    --dtype bf16 -p 512 -n 1 -r 1 --no-probes > $R/ncu-pp-$m.out 2>&1; s "ncu pp512 $m (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s36-agg.py $R/ncu-pp-$m.csv >> "$S" 2>&1
done
bench granite-4.0-h-tiny 1; bench nemotron-3-nano-30b-a3b 1; bench gemma3-1b 1
bench granite-4.0-h-1b 2
