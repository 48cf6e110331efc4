#!/usr/bin/env bash
# Session 38, call B: Gemma's post norms inside the next norm's GEMV (Backend::NormAdd: each
# block's rmsnorm_add run by the feed-forward's, the next layer's q/k/v or the final norm
# GEMV, instead of the last-block epilogue of the o and down GEMVs), arbiter, against HEAD
# 1b9466e (arbiter_epi); and HEAD's next-row rule of the register GEMV (gemv.cu kPipe, the
# shared-x forms left out), which ran on no GPU, against the tree without the next-row loads
# (arbiter_old: 340c395). The cuda op tests and test_cuda whole (new binaries); w1 cuda bf16
# traces byte-identical across the three (scripts/trace-identity.sh); tg128 of the presets,
# the binaries alternating; Nsight Compute of a 4-layer gemma3-1b decode step, both binaries
# (call-a-s26-agg.py, graphs off).
set -u
CARRY=.carry/b38b
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 100 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
$A synth --preset gemma3-1b --dtype bf16 --layers 2 -o synth-g2 --quiet > $R/synth.log 2>&1; s "synth rc=$?"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-gemma2 synth-g2"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh record $B/arbiter_epi $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -3 $R/ident-check.log | tr '\n' ' ')"
bench() {  # binary preset round
  [ "$(left)" -gt 45 ] || { s "skip $1 $2 #$3 (time)"; return; }
  timeout 60 $B/$1 bench --synth $2 --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$1-$2-$3.txt 2>&1
  s "$1 $2 #$3 rc=$? $(grep -E '^\| tg128' $R/bench-$1-$2-$3.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do bench arbiter gemma3-1b $r; bench arbiter_epi gemma3-1b $r; done
for p in qwen3-0.6b granite-4.0-h-1b; do bench arbiter $p 1; bench arbiter_epi $p 1; done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in arbiter arbiter_epi; do
  [ "$(left)" -gt 90 ] || { s "skip ncu $b (time)"; continue; }
  ARBITER_CUDA_GRAPH=0 timeout 60 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    --log-file $R/ncu-$b.csv $B/$b bench --synth gemma3-1b --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 \
    --no-probes > $R/ncu-$b.out 2>&1; s "ncu gemma3-1b $b (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$b.csv >> "$S" 2>&1
done
bench arbiter gemma3-1b 3; bench arbiter_epi gemma3-1b 3
for p in qwen3-0.6b llama-3.2-1b; do bench arbiter_epi $p 2; bench arbiter $p 2; done
