#!/usr/bin/env bash
# Session 36, call A: the hybrids' and MoE models' prefill. The binaries hold (against HEAD
# dab2936) the chunked scan in four kernels (C.B once per group; the chunk states and the
# outputs staged through shared memory in 16-row / 16-token blocks; segment sums from f64
# cumulative sums), the conv a thread per (channel, 64 tokens), and the MoE grouped expert GEMM
# on tensor cores for bf16/f16 (ARBITER_CUDA_MOE_MMA=0: the f32 CUDA-core kernel as before).
# The cuda op tests of the Mamba2 and MoE ops, test_cuda whole; cuda f32/bf16 w8/w256 traces
# of the hybrid and MoE fixtures against ref (compare's gates); the presets' pp512 and tg128
# with MOE_MMA 0/1 and ARBITER_CUDA_SSM_FUSED 0/1 (session 35's conv in the in_proj GEMV,
# alone), alternating; Nsight Compute's per-kernel time of a 4-layer pp512 (call-a-s36-agg.py).
# (No old build beside them: it does not fit the call's 64 MiB with the work tree. Session
# 34's pp512 on an H100 is the before: granite-4.0-h-1b 4.7k, h-tiny 2.7k, nemotron 1.9k,
# qwen3-30b-a3b 2.4k tok/s.)
set -u
CARRY=.carry/b36b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_ops \
  --gtest_filter='*RmsnormMatmul*cuda*:*SsmConv*cuda*:*SsmScan*cuda*:*RmsnormGated*cuda*:*Moe*cuda*' \
  > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_CUDA_MOE_MMA=0 ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*Moe*cuda*' \
  > "$R/test_ops-moe0.log" 2>&1; s "test_ops MOE_MMA=0 rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops-moe0.log" | tail -6 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 220 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
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
bench() {  # preset MOE_MMA SSM_FUSED round
  [ "$(left)" -gt 80 ] || { s "skip $1 $2 $3 #$4 (time)"; return; }
  ARBITER_CUDA_MOE_MMA=$2 ARBITER_CUDA_SSM_FUSED=$3 timeout 100 $A bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3-$4.txt 2>&1
  s "$1 MOE_MMA=$2 SSM_FUSED=$3 #$4 rc=$? $(grep -E '^\| (pp512|tg128)' $R/bench-$1-$2-$3-$4.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do bench granite-4.0-h-1b 1 1 $r; bench granite-4.0-h-1b 1 0 $r; done
bench granite-4.0-h-tiny 1 1 1; bench granite-4.0-h-tiny 0 0 1; bench granite-4.0-h-tiny 1 0 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in granite-4.0-h-1b nemotron-3-nano-30b-a3b; do  # nemotron's first 4: M, E, M, E
  [ "$(left)" -gt 150 ] || { s "skip ncu $m (time)"; continue; }
  ARBITER_CUDA_GRAPH=0 timeout 60 $NCU --clock-control none --metrics gpu__time_duration.sum \
    --csv --log-file $R/ncu-pp-$m.csv $A bench --synth $m --synth-layers 4 --device cuda \
    --dtype bf16 -p 512 -n 1 -r 1 --no-probes > $R/ncu-pp-$m.out 2>&1; s "ncu pp512 $m (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s36-agg.py $R/ncu-pp-$m.csv >> "$S" 2>&1
done
bench qwen3-30b-a3b 1 1 1; bench qwen3-30b-a3b 0 1 1
bench nemotron-3-nano-30b-a3b 1 1 1; bench nemotron-3-nano-30b-a3b 0 1 1
