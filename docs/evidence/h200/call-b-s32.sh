#!/usr/bin/env bash
# Session 32, call B: the binaries of call A plus Qwen2-MoE's shared gate/up through
# rmsnorm_glu. The CUDA tests of the fused and MoE paths (test_cuda's CudaFused, CudaMoe and
# the families; the cuda op tests of moe and rmsnorm_matmul), a w1 trace of tiny-qwen2-moe
# against call A's (arbiter_old: 52c5bef), then where a decode step's time goes now: Nsight
# Compute's per-kernel time and DRAM bytes of the last step of a 4-layer synth bf16 run of
# each MoE preset (call-a-s26-agg.py), graphs off.
set -u
CARRY=.carry/b32b
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda --gtest_filter='CudaFused*:CudaMoe*:*CudaFamilies*' > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*Moe*cuda*:*RmsnormMatmul*cuda*:*RmsnormGlu*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for b in arbiter_old arbiter; do
  timeout 60 $B/$b trace -m tests/fixtures/models/tiny-qwen2-moe --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-q2moe-$b.tsv > /dev/null 2>&1
  s "trace tiny-qwen2-moe $b rc=$? data rows sha $(grep -v '^#' $R/tr-q2moe-$b.tsv | sha256sum | cut -c1-16)"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in qwen3-30b-a3b granite-4.0-h-tiny nemotron-3-nano-30b-a3b; do
  ARBITER_CUDA_GRAPH=0 timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m.csv \
    $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m.csv >> "$S" 2>&1
done
