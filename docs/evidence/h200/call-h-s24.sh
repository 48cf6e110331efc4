#!/usr/bin/env bash
# Session 24, call H: the final binaries after the review's mend (packed_norm_input shared by
# the two packed norm forms): test_cuda whole and the op suite's cuda cases.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/h -xJf .carry/h/bin.tar.xz
B=$PWD/.carry/h/stage
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $B/arbiter build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
timeout 200 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
timeout 150 $B/test_ops --gtest_filter='*cuda*' > "$R/ops.log" 2>&1; s "ops cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|Failure' "$R/ops.log" | tail -8 >> "$S"
