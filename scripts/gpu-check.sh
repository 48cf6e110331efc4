#!/usr/bin/env bash
# The CUDA tier's check on a GPU machine: build, the op suite's cuda tiers and the CUDA tests
# with ARBITER_REQUIRE_CUDA=1 (a missing GPU fails instead of skipping), cuda-vs-ref traces judged by `arbiter compare`,
# then throughput (the CUDA bench test, and `arbiter bench` on a synthetic Qwen3-0.6B-shaped
# checkpoint when the CLI has synth/bench). Logs and summary.txt go to $OUT; a short summary
# table is printed last.
#
# Usage, from the repository root on the GPU machine:
#   scripts/gpu-check.sh                               # configure + build in build-gpu, check
#   ARBITER_PREBUILT=.carry/bin scripts/gpu-check.sh   # use test_cuda + arbiter built elsewhere
# With the device tool: run(command="scripts/gpu-check.sh", ...) ($OUT is set there), or with
# prebuilt binaries: build here (cmake -B build-cuda; cmake --build build-cuda --target
# test_cuda test_ops arbiter), copy build-cuda/tests/test_cuda, build-cuda/tests/test_ops and
# build-cuda/src/arbiter (and libpcre2-8.so.0, libtomlplusplus.so.3) to .carry/bin, and pass carry=[".carry"]. Prebuilt binaries have the source
# path of the machine that built them compiled in (test models are found through it), so the
# script links that path to this checkout when it does not exist.
# Env: OUT (default out/gpu-check); GPU_CHECK_BENCH=0 skips benchmarks; GPU_CHECK_SANITIZE=1
# runs a few op tests under compute-sanitizer; GPU_CHECK_CLI_BENCH=0 skips `arbiter bench`;
# GPU_CHECK_JOBS (default 16).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
JOBS=${GPU_CHECK_JOBS:-16}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
row() { printf '%-40s %s\n' "$1" "$2" >>"$SUMMARY"; }
log() { echo "== $*"; }
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/cuda/lib"
TRACES=/tmp/gpu-check-traces
mkdir -p "$TRACES"

# --- machine ------------------------------------------------------------------------------
{
  date -u
  nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  grep -E '^(NAME|VERSION)=' /etc/os-release 2>&1
  nproc
} >"$OUT/env.txt" 2>&1
row "gpu" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# --- binaries -----------------------------------------------------------------------------
TEST="" OPS="" CLI=""
if [ -z "${ARBITER_PREBUILT:-}" ]; then
  log "configure + build (Release, -j$JOBS)"
  t0=$(date +%s)
  if cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DARBITER_CUDA=ON >"$OUT/build.log" 2>&1 &&
     cmake --build build-gpu -j"$JOBS" --target test_cuda test_ops arbiter >>"$OUT/build.log" 2>&1; then
    TEST=build-gpu/tests/test_cuda OPS=build-gpu/tests/test_ops CLI=build-gpu/src/arbiter
    row "build" "ok ($(( $(date +%s) - t0 )) s, build-gpu)"
  else
    tail -20 "$OUT/build.log"
    row "build" "FAILED (see build.log)"
    if [ -x .carry/bin/test_cuda ]; then ARBITER_PREBUILT=.carry/bin; fi
  fi
fi
if [ -n "${ARBITER_PREBUILT:-}" ]; then
  TEST="$ARBITER_PREBUILT/test_cuda" OPS="$ARBITER_PREBUILT/test_ops" CLI="$ARBITER_PREBUILT/arbiter"
  export LD_LIBRARY_PATH="$PWD/$ARBITER_PREBUILT:$LD_LIBRARY_PATH"
  # The test binary finds models/ under the source dir it was built in (/work/main here).
  if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
  # CLI tests run the arbiter binary at the build path compiled into the test binary.
  if [ ! -x build-cuda/src/arbiter ]; then mkdir -p build-cuda/src && cp "$CLI" build-cuda/src/arbiter; fi
  row "build" "prebuilt binaries from $ARBITER_PREBUILT"
fi
if [ -z "$TEST" ] || [ ! -x "$TEST" ]; then
  row "tests" "NOT RUN (no test binary)"
  echo; cat "$SUMMARY"; exit 1
fi

# --- op suite on the cuda tiers ----------------------------------------------------------
if [ -x "$OPS" ]; then
  log "op suite, cuda tiers (ARBITER_REQUIRE_CUDA=1)"
  t0=$(date +%s)
  ARBITER_REQUIRE_CUDA=1 timeout 300 "$OPS" --gtest_filter='*cuda*:MatmulBound*' >"$OUT/ops.log" 2>&1
  rc=$?
  row "op suite (cuda tiers)" "rc=$rc pass=$(grep -c '^\[       OK \]' "$OUT/ops.log") fail=$(grep -c '^\[  FAILED  \] .*(' "$OUT/ops.log") ($(( $(date +%s) - t0 )) s)"
  grep -E 'Failure|Expected|actual|element' "$OUT/ops.log" | head -30
else
  row "op suite (cuda tiers)" "NOT RUN (no test_ops binary)"
fi

# --- CUDA tests ---------------------------------------------------------------------------
log "CUDA tests (ARBITER_REQUIRE_CUDA=1)"
t0=$(date +%s)
ARBITER_REQUIRE_CUDA=1 timeout 300 "$TEST" --gtest_filter='-CudaBench.*' >"$OUT/tests.log" 2>&1
rc=$?
grep -E '^(NMSE|MODEL)' "$OUT/tests.log" >"$OUT/nmse.txt"
pass=$(grep -c '^\[       OK \]' "$OUT/tests.log")
fail=$(grep -c '^\[  FAILED  \] .*(' "$OUT/tests.log")
skip=$(grep -c '^\[  SKIPPED \] .*(' "$OUT/tests.log")
row "cuda tests" "rc=$rc pass=$pass fail=$fail skip=$skip ($(( $(date +%s) - t0 )) s)"
grep -E '^\[  FAILED  \]' "$OUT/tests.log" | head -20
grep -E 'Failure|Expected|Which is|worst element' "$OUT/tests.log" | head -30

if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  log "compute-sanitizer memcheck on a few op tests"
  ARBITER_REQUIRE_CUDA=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$OPS" \
    --gtest_filter='Tiers/Attention.*/cuda_bf16:Tiers/Summarize.*/cuda_f32:Tiers/KvStore.*/cuda_f16:Tiers/Rmsnorm.*/cuda_bf16' \
    >>"$OUT/tests.log" 2>&1
  row "compute-sanitizer memcheck" "rc=$? (0 clean, 9 errors found; log in tests.log)"
fi

# --- traces: cuda vs ref, judged by arbiter compare ---------------------------------------
if [ -x "$CLI" ] && "$CLI" --help 2>&1 | grep -q trace && "$CLI" --help 2>&1 | grep -q compare; then
  log "traces cuda vs ref"
  MODEL=models/TinyStories-656K
  CORPUS=models/corpus/stories.txt
  # w8 runs 521 positions; the model has 512 (the trace header records the long context).
  LONG=--allow-long-context
  : >"$OUT/traces.log"
  for shape in w1 w8 w256; do
    timeout 120 "$CLI" trace -m "$MODEL" --corpus "$CORPUS" --shape $shape $LONG --device ref \
      -o "$TRACES/ref.$shape.tsv" --quiet >>"$OUT/traces.log" 2>&1
    for dt in f32 bf16; do
      t0=$(date +%s.%N)
      timeout 120 "$CLI" trace -m "$MODEL" --corpus "$CORPUS" --shape $shape $LONG --device cuda \
        --dtype $dt -o "$TRACES/cuda-$dt.$shape.tsv" --quiet --stats >>"$OUT/traces.log" 2>&1
      trc=$?
      echo "-- compare ref cuda-$dt $shape" >>"$OUT/traces.log"
      "$CLI" compare "$TRACES/ref.$shape.tsv" "$TRACES/cuda-$dt.$shape.tsv" >>"$OUT/traces.log" 2>&1
      crc=$?
      row "trace $shape cuda $dt vs ref" "trace rc=$trc compare rc=$crc (0 pass 1 fail 2 inconclusive)"
    done
  done
else
  row "traces" "skipped (CLI has no trace/compare)"
fi

# --- throughput ---------------------------------------------------------------------------
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  log "CUDA bench test"
  ARBITER_CUDA_BENCH=1 ARBITER_REQUIRE_CUDA=1 timeout 240 "$TEST" --gtest_filter='CudaBench.*' \
    >"$OUT/bench.log" 2>&1
  row "bench test" "rc=$?"
  if [ "${GPU_CHECK_CLI_BENCH:-1}" != 0 ] && [ -x "$CLI" ] && "$CLI" --help 2>&1 | grep -q bench &&
     "$CLI" --help 2>&1 | grep -q synth; then
    preset=$("$CLI" synth --list 2>&1 | awk '{print $1}' | grep -i -m1 'qwen3-0.6b')
    if [ -n "$preset" ]; then
      log "arbiter bench on synthetic $preset"
      timeout 60 "$CLI" synth --preset "$preset" --dtype bf16 -o /tmp/synth-"$preset" --force \
        >"$OUT/cli-bench.log" 2>&1
      for dt in bf16 f32; do
        shapes=""
        [ $dt = bf16 ] && shapes="--shapes w256 --corpus models/corpus/stories.txt"
        timeout 150 "$CLI" bench -m /tmp/synth-"$preset" --device cuda --dtype $dt --stats $shapes \
          >>"$OUT/cli-bench.log" 2>&1
        row "arbiter bench $preset cuda $dt" "rc=$?"
      done
    fi
  fi
fi

echo
echo "== NMSE per op (worst per op and dtype)"
awk '$1=="NMSE" { key=$2" "$3; for (i=4;i<=NF;i++) if ($i ~ /^nmse=/) { v=substr($i,6)+0; b=0;
       for (j=i;j<=NF;j++) if ($j ~ /^bound=/) b=substr($j,7)+0;
       if (!(key in w) || v > w[key]) { w[key]=v; bd[key]=b } } }
     END { for (k in w) printf "  %-18s nmse %.3e  (bound %.3e)\n", k, w[k], bd[k] }' \
  "$OUT/nmse.txt" | sort
grep '^MODEL' "$OUT/nmse.txt"
grep '^BENCH' "$OUT/bench.log" 2>/dev/null
grep -E 'tok/s|GB/s|pp|tg' "$OUT/cli-bench.log" 2>/dev/null | head -20
echo
echo "== summary"
cat "$SUMMARY"
