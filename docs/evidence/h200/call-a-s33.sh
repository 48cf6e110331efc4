#!/usr/bin/env bash
# Session 33, call A: the routing kernel as a block per token with a thread per expert (ranks
# counted in one pass, no sequential argmax rounds). The cuda op tests of moe (now with 72-128
# experts) and test_cuda's MoE and fused paths; w1 and w8 traces of the MoE fixtures from
# arbiter_old (52e5bc4, session 32's last code) and arbiter (the same bits?); the two binaries
# alternating on synth bf16 decode of the MoE presets; Nsight Compute's per-kernel time of a
# 4-layer qwen3-30b-a3b decode step (call-a-s26-agg.py), graphs off.
set -u
CARRY=.carry/b33a
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*Moe*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda --gtest_filter='CudaFused*:CudaMoe*:*CudaFamilies*' > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-qwen3-moe tiny-qwen2-moe tiny-mixtral tiny-granite-h-moe tiny-nemotron-h; do
  for sh in w1 w8; do
    for b in arbiter_old arbiter; do
      timeout 60 $B/$b trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape $sh --corpus $C -o $R/tr-$f-$sh-$b.tsv > /dev/null 2>&1
      s "trace $f $sh $b rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$sh-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$sh-$b.tsv) rows)"
    done
  done
done
bench() {  # preset binary round
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for m in granite-4.0-h-tiny qwen3-30b-a3b nemotron-3-nano-30b-a3b; do
  bench $m arbiter_old 1; bench $m arbiter 1
done
bench qwen3-30b-a3b arbiter 2; bench qwen3-30b-a3b arbiter_old 2
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
m=qwen3-30b-a3b
ARBITER_CUDA_GRAPH=0 timeout 100 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m.csv \
  $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m (4 layers) rc=$?"
python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m.csv >> "$S" 2>&1
