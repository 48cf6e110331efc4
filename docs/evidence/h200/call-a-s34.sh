#!/usr/bin/env bash
# Session 34, call A. arbiter_old is 8e8be0a (session 33's last code); arbiter adds afbb012
# (the norm epilogue's row in dynamic shared memory, reserved only by launches that have the
# epilogue: 3103644 again, never run on a GPU before) and ssm_scan_norm (the decode step's
# scan with the gated norm in its grid's last block). The cuda op tests of both and test_cuda
# whole; cuda w1 and w8 traces of the hybrid and gemma fixtures from both binaries (the same
# bits?); the two alternating on the hybrids' decode and on gemma3-1b and qwen3-0.6b; then a
# snapshot of the other presets an issue floor names; last, Nsight Compute's per-kernel time
# of a 4-layer granite-4.0-h-1b decode step (call-a-s26-agg.py), graphs off.
set -u
CARRY=.carry/b34a
source "$(dirname "$0")/call-common.sh"
LIMIT=570
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
( $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops \
  --gtest_filter='*SsmScanNorm*cuda*:*SsmScan*cuda*:*RmsnormGated*cuda*:*RmsnormAdd*cuda*:*Matmul*cuda*' \
  > "$R/test_ops.log" 2>&1; s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
C=models/corpus/stories.txt
for f in tiny-granite-h tiny-granite-h-moe tiny-nemotron-h tiny-gemma3 tiny-gemma2; do
  for sh in w1 w8; do
    for b in arbiter_old arbiter; do
      timeout 60 $B/$b trace -m tests/fixtures/models/$f --device cuda --dtype bf16 --shape $sh --corpus $C -o $R/tr-$f-$sh-$b.tsv > /dev/null 2>&1
      s "trace $f $sh $b rc=$? data rows sha $(grep -v '^#' $R/tr-$f-$sh-$b.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$f-$sh-$b.tsv) rows)"
    done
  done
done
bench() {  # preset binary round
  [ "$(left)" -gt 60 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 120 $B/$2 bench --synth $1 --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ')"
}
for r in 1 2; do
  bench granite-4.0-h-1b arbiter_old $r; bench granite-4.0-h-1b arbiter $r
done
bench granite-4.0-h-tiny arbiter_old 1; bench granite-4.0-h-tiny arbiter 1
bench granite-4.0-h-tiny arbiter 2; bench granite-4.0-h-tiny arbiter_old 2
bench gemma3-1b arbiter_old 1; bench gemma3-1b arbiter 1
bench qwen3-0.6b arbiter 1; bench qwen3-0.6b arbiter_old 1
bench nemotron-3-nano-30b-a3b arbiter 1
for m in llama-3.2-1b qwen3-8b qwen3-30b-a3b; do bench $m arbiter 1; done
wait $SYN; s "synth q8b rc=$?"
if [ "$(left)" -gt 60 ]; then
  timeout 100 $A bench -m /tmp/q8b.gguf --device cuda -p 512 -n 128 -r 2 > $R/bench-q8b.txt 2>&1
  s "qwen3-8b Q4_K_M rc=$? $(grep -E '^\| tg128' $R/bench-q8b.txt | tr -s ' ')"
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
m=granite-4.0-h-1b
if [ "$(left)" -gt 45 ]; then
  ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 10 )) $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m.csv \
    $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m.csv >> "$S" 2>&1
fi
