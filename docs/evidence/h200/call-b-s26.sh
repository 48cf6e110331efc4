#!/usr/bin/env bash
# Session 26, call B: call A's kernels with the shared-memory limit fixed and two MMA chains
# per super-block (arbiter), the same with the weights read through an L2 evict-first policy
# and no L1 allocation (arbiter-s), and session 25's (arbiter-old): tests, bench on Q4_K_M
# qwen3-8b and qwen3-0.6b, ncu kernel times of a decode step, the qmma kernels' stall reasons.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/b -xJf .carry/b/bin.tar.xz
B=$PWD/.carry/b/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
mkdir -p build-cuda/src && cp $A build-cuda/src/arbiter
S="$R/summary.txt"; { date -u; nvidia-smi -L; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
( $A synth --preset qwen3-0.6b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q06.gguf && \
  $A synth --preset qwen3-8b --dtype q4_k_m --seed 0 -t 12 -q -o /tmp/q8b.gguf ) > $R/synth.log 2>&1 &
SYN=$!
timeout 120 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
true
true
wait $SYN; s "synth rc=$? $(ls -la /tmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
bq() {  # name, binary, env assignments..., then bench arguments
  local n=$1 bin=$2; shift 2; local envs=(X=1)
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  env "${envs[@]}" timeout $(( $(left) - 20 )) $bin bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\| (pp|tg)' "$R/bench-$n.txt" | tr -s ' ' >> "$S"; tail -1 "$R/bench-$n.txt" | grep -i error >> "$S"
}
bq q8b-new $A -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q8b-s $A ARBITER_QMMA_STREAM=1 -m /tmp/q8b.gguf -p 512 -n 128 -r 2
bq q06-new $A -m /tmp/q06.gguf -p 512 -n 128 -r 2
bq q06-s $A ARBITER_QMMA_STREAM=1 -m /tmp/q06.gguf -p 512 -n 128 -r 2
nq() {  # name, binary, then bench arguments: ncu kernel times of the decode's kernels
  local n=$1 bin=$2; shift 2
  [ "$(left)" -gt 60 ] || { s "skip ncu $n (time)"; return; }
  ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 30 )) ncu --clock-control none --kernel-name regex:"qmma|attn_decode|pick" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
    $bin bench "$@" --device cuda --dtype bf16 --no-probes > "$R/ncu-$n.csv" 2> "$R/ncu-$n.err"
  s "ncu $n rc=$?"; python3 docs/evidence/h200/call-a-s26-agg.py "$R/ncu-$n.csv" >> "$S" 2>&1
}
nq q8b-new $A -m /tmp/q8b.gguf -p 8 -n 3 -r 1
ARBITER_QMMA_STREAM=1 nq q8b-s $A -m /tmp/q8b.gguf -p 8 -n 3 -r 1
[ "$(left)" -gt 100 ] && { ARBITER_CUDA_GRAPH=0 timeout 90 ncu --clock-control none --kernel-name regex:qmma --launch-skip 30 --launch-count 5 \
  --section SourceCounters --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis -o $R/qmma \
  $A bench -m /tmp/q8b.gguf -p 8 -n 3 -r 1 --no-probes --device cuda --dtype bf16 > $R/ncu-src.log 2>&1; s "ncu source rc=$?";
  ncu -i $R/qmma.ncu-rep --page raw --csv > $R/qmma-raw.csv 2> $R/qmma-raw.err; s "raw rc=$?"
  ncu -i $R/qmma.ncu-rep --page source --csv --print-source sass > $R/qmma-source.csv 2> $R/qmma-source.err; s "source rc=$?";
  ncu -i $R/qmma.ncu-rep --page details > $R/qmma-details.txt 2>&1; gzip $R/qmma-source.csv $R/qmma-raw.csv; rm -f $R/qmma.ncu-rep; }
true
