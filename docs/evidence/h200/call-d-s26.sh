#!/usr/bin/env bash
# Session 26, call D: the final MoE decode kernels (4 down rows per block for rows of up to 1,024 values, else 1): tests and the MoE presets.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/d -xJf .carry/d/bin.tar.xz
B=$PWD/.carry/d/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 120 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
timeout 90 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|Failure' "$R/ops.log" | tail -8 >> "$S"
bq() {  # name, env assignments..., then bench arguments
  local n=$1; shift; local envs=(X=1)
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -1 "$R/bench-$n.txt" | grep -i error >> "$S"
}
bq gtiny-new --synth granite-4.0-h-tiny -p 512 -n 128 -r 2
bq q30-new --synth qwen3-30b-a3b -p 512 -n 128 -r 2
bq nemo-new --synth nemotron-3-nano-30b-a3b -p 512 -n 128 -r 2
true
