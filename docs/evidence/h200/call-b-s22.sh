#!/usr/bin/env bash
# Session 22, call B: the CUDA tier's continuous batching (paged.cpp) and the changed tests:
# op suite (cuda tiers), test_cuda (CudaBatching.*, CudaFamilies.*, the rest), --batch-with
# traces compared against ref, bench --concurrency 1,8,64 on qwen3-0.6b and qwen3-8b, and the
# nemotron-3-nano bench that failed in call A.
set -u
cd "$(dirname "$0")/.."
T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry -xJf .carry/bin13.tar.xz
B=$PWD/.carry/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 90 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops rc=$?"; grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/ops.log" | tail -20 >> "$S"
grep -E "^NMSE attention_batch|^NMSE attention_paged" "$R/ops.log" | grep cuda | sort -t= -k3 | tail -4 >> "$S"
timeout 150 $B/test_cuda --gtest_filter='CudaBatching.*:CudaFamilies.Bf16*' > "$R/cuda-new.log" 2>&1; s "test_cuda new rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[ batch|^\[ bf16|flip at' "$R/cuda-new.log" | head -60 >> "$S"
timeout 120 $B/test_cuda --gtest_filter='-CudaBench.*:CudaBatching.*:CudaFamilies.Bf16*' > "$R/cuda.log" 2>&1; s "test_cuda rest rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED' "$R/cuda.log" | tail -20 >> "$S"
# --batch-with traces on cuda against ref (compare's verdict), w8 and w1ctx512 shapes.
for m in models/TinyStories-656K tests/fixtures/models/tiny-gemma3 tests/fixtures/models/tiny-qwen3-moe tests/fixtures/models/tiny-granite-h; do
  n=$(basename $m)
  for sh in w8 w1ctx512; do
    $A trace -m $m --corpus models/corpus/stories.txt --shape $sh --topk 8 --device ref --allow-long-context --quiet -o $R/$n.$sh.ref.tsv 2> $R/$n.$sh.err
    for dt in bf16 f32; do
      $A trace -m $m --corpus models/corpus/stories.txt --shape $sh --topk 8 --device cuda --dtype $dt --batch-with 7 --allow-long-context --quiet -o $R/$n.$sh.$dt.tsv 2>> $R/$n.$sh.err
      $A compare $R/$n.$sh.ref.tsv $R/$n.$sh.$dt.tsv > $R/$n.$sh.$dt.cmp 2>&1
      s "batch-with $n $sh $dt rc=$?: $(grep -m1 -iE '^verdict|^answer|PASS|FAIL|INCONCLUSIVE' $R/$n.$sh.$dt.cmp)"
    done
  done
  [ "$(left)" -gt 300 ] || break
done
rm -f $R/*.tsv
bconc() {  # name, args...
  local n=$1; shift
  [ "$(left)" -gt 60 ] || { s "skip $n (time)"; return; }
  timeout $(( $(left) - 30 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\|' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -2 "$R/bench-$n.txt" >> "$S"
}
bconc conc-qwen3-0.6b --synth qwen3-0.6b --concurrency 1,8,64 -p 128 -n 64 -r 1
bconc conc-qwen3-8b --synth qwen3-8b --concurrency 1,8,64 -p 128 -n 64 -r 1
bconc nemotron-3-nano-30b-a3b --synth nemotron-3-nano-30b-a3b -p 512 -n 128 -r 2
