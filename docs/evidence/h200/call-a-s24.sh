#!/usr/bin/env bash
# Session 24, call A (binaries of dca56f7): where a batched decode step's time goes (issue 31):
# bench --concurrency on qwen3-8b and qwen3-0.6b synth with 4 layers and full depth, then
# ncu's kernel times of the same runs summed over the last batched step (agg: the kernels
# after the second-to-last run of pick_kernel launches through the last run, summed by name).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-520}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r; mkdir -p $R
tar -C .carry/a -xJf .carry/a/bin.tar.xz
B=$PWD/.carry/a/stage; A=$B/arbiter
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r.tgz" r; cat "$S"; }
trap fin EXIT
export ARBITER_REQUIRE_CUDA=1
bq() {  # name, then bench arguments
  local n=$1; shift
  [ "$(left)" -gt 40 ] || { s "skip $n (time)"; return; }
  timeout $(( $(left) - 20 )) $A bench "$@" --device cuda --dtype bf16 > "$R/bench-$n.txt" 2>&1
  s "bench $n rc=$?"; grep -E '^\|' "$R/bench-$n.txt" | tr -s ' ' >> "$S"
}
# .carry/a/agg.py is docs/evidence/h200/call-a-s24-agg.py.
nq() {  # name, then bench arguments: ncu kernel times, last step
  local n=$1; shift
  [ "$(left)" -gt 60 ] || { s "skip ncu $n (time)"; return; }
  ARBITER_CUDA_GRAPH=0 timeout $(( $(left) - 20 )) ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    $A bench "$@" --device cuda --dtype bf16 --no-probes > "$R/ncu-$n.csv" 2> "$R/ncu-$n.err"
  s "ncu $n rc=$?"; python3 .carry/a/agg.py "$R/ncu-$n.csv" "$n" 14 >> "$S" 2>&1
}
bq c8b4 --synth qwen3-8b --synth-layers 4 --concurrency 1,8,64 -p 8 -n 16 -r 1
bq c06 --synth qwen3-0.6b --concurrency 1,8,64 -p 8 -n 16 -r 1
nq c8b4-64 --synth qwen3-8b --synth-layers 4 --concurrency 64 -p 8 -n 4 -r 1
nq c8b4-1 --synth qwen3-8b --synth-layers 4 --concurrency 1 -p 8 -n 4 -r 1
nq c06-64 --synth qwen3-0.6b --synth-layers 4 --concurrency 64 -p 8 -n 4 -r 1
bq c8b --synth qwen3-8b --concurrency 1,64 -p 8 -n 16 -r 1
