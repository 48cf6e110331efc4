#!/usr/bin/env bash
# Session 23, call G: the MoE router kernel with its top-k in registers and the slot weights
# across lanes (moe.cu): the op suite's Moe/SigmoidGate cases on the cuda tiers (ids, margins
# and outputs against ref), test_cuda's CudaMoe and CudaFamilies, then decode of the MoE
# presets (bench --synth, bf16).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/d1 -xJf .carry/d1/bin.tar.xz
B=$PWD/.carry/d1/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 90 $B/test_ops --gtest_filter='*Moe*:*SigmoidGate*' > "$R/ops-moe.log" 2>&1; s "ops Moe rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|^\[       OK.*cuda' "$R/ops-moe.log" | head -20 >> "$S"
timeout 150 $B/test_cuda --gtest_filter='CudaMoe.*:CudaFamilies.*:CudaBatching.BatchWith*' > "$R/cuda-moe.log" 2>&1; s "test_cuda MoE rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|flip at' "$R/cuda-moe.log" | head -20 >> "$S"
bq() {  # name, bench arguments
  local n=$1; shift
  [ "$(left)" -gt 60 ] || { s "skip $n (time)"; return; }
  timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 -p 512 -n 128 -r 2 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
bq qwen3-30b-a3b --synth qwen3-30b-a3b
bq granite-4.0-h-tiny --synth granite-4.0-h-tiny
bq nemotron-3-nano-30b-a3b --synth nemotron-3-nano-30b-a3b
