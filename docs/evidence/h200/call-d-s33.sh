#!/usr/bin/env bash
# Session 33, call D: call C's matmul_rmsnorm_add with another epilogue. Call C's last block
# took the norm with one warp whose loads waited on each other (gemma3-1b decode 795 against
# 814 tok/s); here all its threads load the row into shared memory at once, one warp sums the
# squares from there, and all threads normalise and add. The cuda
# op tests of rmsnorm_add and matmul_rmsnorm_add and test_cuda; cuda w1 and w8 traces of the
# gemma fixtures from arbiter_old (b329cec) and arbiter (the same bits?); the two binaries
# alternating on synth bf16 decode of gemma3-1b, and of two dense presets (the plain GEMV has
# the epilogue's branch now); Nsight Compute's per-kernel time of a 4-layer gemma3-1b decode
# step (call-a-s26-agg.py), graphs off.
set -u
CARRY=.carry/b33d
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*RmsnormAdd*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-gemma3 tiny-gemma2; do
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
for r in 1 2; do
  bench gemma3-1b arbiter_old $r; bench gemma3-1b arbiter $r
done
bench gemma3-1b arbiter 3; bench gemma3-1b arbiter_old 3
bench qwen3-0.6b arbiter_old 1; bench qwen3-0.6b arbiter 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
m=gemma3-1b
ARBITER_CUDA_GRAPH=0 timeout 100 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m.csv \
  $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m (4 layers) rc=$?"
python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m.csv >> "$S" 2>&1
