#!/usr/bin/env bash
# Session 35, call A: the hybrids' Mamba2 layer in 3 decode launches instead of 5
# (rmsnorm_matmul_conv: the conv inside the in_proj GEMV's xBC rows; rmsnorm_gated_matmul_add:
# the gated norm inside out_proj's GEMV + add, in rmsnorm_gated_kernel's sum order; and
# ssm_conv_kernel through conv_step). The cuda op tests of both at the presets' shapes, of the
# conv, the scan, the norm + GEMV and the GEMV + add, then test_cuda whole; cuda w1/w8/w256
# traces of the hybrid fixtures with ARBITER_CUDA_SSM_FUSED=0 (the five launches) and without
# (the same bits?); the two alternating on the hybrids' decode; Nsight Compute's per-kernel
# time of a 4-layer granite-4.0-h-1b decode step in both (call-a-s26-agg.py), graphs off.
set -u
CARRY=.carry/b35a
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 150 $B/test_ops \
  --gtest_filter='*RmsnormMatmul*cuda*:*SsmConv*cuda*:*SsmScan*cuda*:*RmsnormGated*cuda*:*MatmulAdd*cuda*' \
  > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 220 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-granite-h tiny-granite-h-moe tiny-nemotron-h; do
  for sh in w1 w8 w256; do
    for v in 0 1; do
      ARBITER_CUDA_SSM_FUSED=$v timeout 60 $A trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape $sh --corpus $C -o $R/tr-$f-$sh-$v.tsv > /dev/null 2>&1
      s "trace $f $sh SSM_FUSED=$v rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$sh-$v.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$sh-$v.tsv) rows)"
    done
  done
done
bench() {  # preset SSM_FUSED round
  [ "$(left)" -gt 50 ] || { s "skip $1 $2 #$3 (time)"; return; }
  ARBITER_CUDA_SSM_FUSED=$2 timeout 100 $A bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 SSM_FUSED=$2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for r in 1 2; do bench granite-4.0-h-1b 0 $r; bench granite-4.0-h-1b 1 $r; done
bench granite-4.0-h-tiny 0 1; bench granite-4.0-h-tiny 1 1
bench granite-4.0-h-tiny 1 2; bench granite-4.0-h-tiny 0 2
bench nemotron-3-nano-30b-a3b 0 1; bench nemotron-3-nano-30b-a3b 1 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
m=granite-4.0-h-1b
for v in 0 1; do
  [ "$(left)" -gt 40 ] || { s "skip ncu SSM_FUSED=$v (time)"; continue; }
  ARBITER_CUDA_SSM_FUSED=$v ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 10 )) $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m-$v.csv \
    $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m-$v.out 2>&1; s "ncu $m SSM_FUSED=$v (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m-$v.csv >> "$S" 2>&1
done
