#!/usr/bin/env bash
# Session 39, call A. arbiter: HEAD (996d01b: one shared-memory staging in the register GEMV)
# plus the loop GEMV's first group of weight loads issued before griddep_wait
# (ARBITER_CUDA_LOOP_EARLY=0 turns that off: session 38's loop kernel). arbiter_nopre: 996d01b
# with the NormAdd compiled out of the register norm GEMV (gemv.cu `constexpr bool pre =
# false;`, `hs[1]`; fused.cpp pre_fusable false: gemma's NormAdd as cuda.rmsnorm_add), session
# 38's call D. The cuda op tests and test_cuda; w1 cuda bf16 traces identical between the two
# binaries; tg128 alternating: nopre against HEAD with the loop kernel as before, then the
# early loads on and off; the decode attention's keys per split (ARBITER_CUDA_ATTN_SPLIT_KEYS)
# on gemma3-1b; Nsight Compute of a 4-layer gemma3-1b step, early on and off.
set -u
CARRY=.carry/b39a
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
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh record $B/arbiter_nopre $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES=w1 MODELS="$IDM" timeout 60 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -3 $R/ident-check.log | tr '\n' ' ')"
SHAPES=w1 MODELS="$IDM" ARBITER_CUDA_LOOP_EARLY=0 timeout 60 bash scripts/trace-identity.sh check $A $R/ident.tsv \
  > $R/ident-check0.log 2>&1; s "identity check (early off) rc=$? $(tail -1 $R/ident-check0.log)"
bench() {  # tag binary preset [env...]: tg128
  local tag=$1 bin=$2 p=$3; shift 3
  [ "$(left)" -gt 45 ] || { s "skip $tag $p (time)"; return; }
  env "$@" timeout 60 $B/$bin bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for p in qwen3-0.6b gemma3-1b; do
    bench nopre$r arbiter_nopre $p; bench head$r arbiter $p ARBITER_CUDA_LOOP_EARLY=0
  done
done
for r in 1 2; do
  for p in gemma3-1b llama-3.2-1b qwen3-8b; do
    bench early$r arbiter $p; bench late$r arbiter $p ARBITER_CUDA_LOOP_EARLY=0
  done
done
for k in 32 64 128; do bench split$k arbiter gemma3-1b ARBITER_CUDA_ATTN_SPLIT_KEYS=$k; done
bench split256 arbiter gemma3-1b
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for e in 1 0; do
  [ "$(left)" -gt 90 ] || { s "skip ncu early=$e (time)"; continue; }
  ARBITER_CUDA_LOOP_EARLY=$e ARBITER_CUDA_GRAPH=0 timeout 60 $NCU --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$e.csv \
    $A bench --synth gemma3-1b --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 \
    --no-probes > $R/ncu-$e.out 2>&1; s "ncu gemma3-1b early=$e (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$e.csv >> "$S" 2>&1
done
for p in qwen3-0.6b gemma3-1b llama-3.2-1b; do
  bench nopre3 arbiter_nopre $p; bench head3 arbiter $p ARBITER_CUDA_LOOP_EARLY=0; bench early3 arbiter $p
done
