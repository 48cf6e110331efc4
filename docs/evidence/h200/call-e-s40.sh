#!/usr/bin/env bash
# Session 40, call E. arbiter: call D's tree plus the roped q and k heads in padded shared-memory
# rows too (norm_rope_head's PE); arbiter_old: c57408e (call D's arbiter: only the partial outputs
# padded). The cuda op tests and test_cuda; w1 cuda bf16 traces identical between the
# two binaries; tg128 alternating; Nsight Compute of gemma3-1b's attention launch, as call C.
set -u
CARRY=.carry/b40e
source "$(dirname "$0")/call-common.sh"
LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
ARBITER_REQUIRE_CUDA=1 timeout 120 $B/test_ops --gtest_filter='*cuda*' > "$R/test_ops.log" 2>&1
s "test_ops rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_ops.log" | tail -12 >> "$S"
ARBITER_REQUIRE_CUDA=1 timeout 120 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
$A synth --preset gemma3-1b --dtype bf16 --layers 2 -o synth-g2 --quiet > $R/synth.log 2>&1; s "synth rc=$?"
IDM="models/TinyStories-656K tests/fixtures/models/tiny-granite-h tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-gemma2 synth-g2"
SHAPES="w1 w8" MODELS="$IDM" timeout 90 bash scripts/trace-identity.sh record $B/arbiter_old $R/ident.tsv cuda:bf16 \
  > $R/ident-record.log 2>&1; s "identity record rc=$?"
SHAPES="w1 w8" MODELS="$IDM" timeout 90 bash scripts/trace-identity.sh check $A $R/ident.tsv > $R/ident-check.log 2>&1
s "identity check rc=$? $(tail -3 $R/ident-check.log | tr '\n' ' ')"
bench() {  # tag binary preset
  local tag=$1 bin=$2 p=$3
  [ "$(left)" -gt 40 ] || { s "skip $tag $p (time)"; return; }
  timeout 60 $B/$bin bench --synth $p --device cuda --dtype bf16 -p 64 -n 128 -r 2 ${DEPTH:+--depth $DEPTH} \
    > $R/bench-$tag-$p.txt 2>&1
  s "$tag $p rc=$? $(grep -E '^\| tg128' $R/bench-$tag-$p.txt | tr -s ' ' | tr '\n' ' ')"
}
for r in 1 2; do
  for p in gemma3-1b qwen3-0.6b llama-3.2-1b; do bench old$r arbiter_old $p; bench new$r arbiter $p; done
done
DEPTH=4096 bench old-d4096 arbiter_old gemma3-1b; DEPTH=4096 bench new-d4096 arbiter gemma3-1b
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ "$(left)" -gt 40 ] && ARBITER_CUDA_GRAPH=0 timeout 60 $NCU --clock-control none --kernel-name regex:attn_decode \
  --launch-skip 8 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --csv --page details \
  $A bench --synth gemma3-1b --synth-layers 4 --device cuda --dtype bf16 -p 64 -n 4 -r 1 --no-probes \
  > $R/ncu-new.csv 2>&1; s "ncu rc=$?"
grep -E '"Duration"|Bank|bank' $R/ncu-new.csv | cut -c1-400 | tail -6 >> "$S"
