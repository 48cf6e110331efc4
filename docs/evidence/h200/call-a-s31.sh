#!/usr/bin/env bash
# Session 31, call A: the loop GEMV (rows too long for the register kernel) split along K over
# 1, 2, 4 or 8 warps of a block (ARBITER_GEMV_SLICES, a knob of this measurement only; without
# it the rule in gemv.cu picks). arbiter_old (6484ffb, one warp a row) and arbiter alternate
# on synth bf16 decode of models whose down projection takes that kernel (gemma3-1b K 6,912,
# llama-3.2-1b 8,192, qwen3-8b 12,288); w1 cuda traces of gemma3-1b, twice per setting
# (deterministic?); Nsight Compute time of the loop kernel per setting. test_cuda and the
# cuda tiers' op tests (test_ops) first.
set -u
CARRY=.carry/b31a
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 200 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1; s "test_ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
bench() {  # model label env...
  local m=$1 l=$2; shift 2
  env "$@" timeout 100 $B/${BIN:-arbiter} bench --synth $m --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$m-$l.txt 2>&1
  s "$m $l rc=$? $(grep -E '^\| tg128' $R/bench-$m-$l.txt | tr -s ' ')"
}
for m in gemma3-1b llama-3.2-1b qwen3-8b; do
  for round in 1 2; do
    BIN=arbiter_old bench $m old-$round X=1
    bench $m rule-$round X=1
    for k in 1 2 4 8; do bench $m s$k-$round ARBITER_GEMV_SLICES=$k; done
  done
done
C=models/corpus/stories.txt
m=gemma3-1b
$A synth --preset $m --dtype bf16 --seed 0 -t 12 -q -o /tmp/$m > /dev/null 2>&1
for k in 1 2 4 8; do
  for i in 1 2; do
    ARBITER_GEMV_SLICES=$k timeout 100 $A trace -m /tmp/$m --device cuda --dtype bf16 --shape w1 --corpus $C -o $R/tr-$m-s$k-$i.tsv > /dev/null 2>&1
    s "trace $m s$k #$i rc=$? data rows sha $(grep -v '^#' $R/tr-$m-s$k-$i.tsv | sha256sum | cut -c1-16) ($(grep -vc '^#' $R/tr-$m-s$k-$i.tsv) rows)"
  done
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in 1 2 4 8; do
  ARBITER_GEMV_SLICES=$k timeout 150 $NCU --clock-control none --kernel-name regex:gemv_kernel --metrics gpu__time_duration.sum --csv --log-file $R/ncu-$m-s$k.csv \
    $A bench -m /tmp/$m --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m-s$k.out 2>&1
  s "ncu $m s$k rc=$? $(python3 - $R/ncu-$m-s$k.csv <<'PY'
import csv, sys
v = [float(r["Metric Value"].replace(",", "")) for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
     if r.get("Metric Name") == "gpu__time_duration.sum"]
print(f"gemv_kernel {len(v)} launches, mean {sum(v)/max(len(v),1)/1e3:.2f} us, min {min(v or [0])/1e3:.2f}")
PY
)"
done
