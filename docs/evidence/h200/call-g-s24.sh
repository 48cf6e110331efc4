#!/usr/bin/env bash
# Session 24, call G, right after F on the same (warm) machine: llama.cpp 80fb11a (CUDA,
# sm_90, carried) on the GGUFs call F wrote to /tmp and benched: llama-batched-bench at 1, 8
# and 64 streams of 128 + 64 tokens on the bf16 files, llama-bench pp512/tg128 on the Q4_K_M.
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/r2; mkdir -p $R
tar -C .carry/g -xJf .carry/g/peers.tar.xz
L=$PWD/.carry/g/peers/bin
export LD_LIBRARY_PATH=$L:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
S="$R/summary.txt"; { date -u; nvidia-smi -L; hostname; ls -la /tmp/*.gguf; } > "$S" 2>&1
s() { echo "== [$(( $(date +%s) - T0 ))s] $*" >> "$S"; }
fin() { s done; tar -C /tmp -czf "$OUT/r2.tgz" r2; cat "$S"; }
trap fin EXIT
export GGML_NO_BACKTRACE=1
for m in q06-bf16 q8b-bf16; do
  [ -f /tmp/$m.gguf ] || { s "no /tmp/$m.gguf"; continue; }
  timeout 200 $L/llama-batched-bench -m /tmp/$m.gguf -c $((64 * 192 + 16)) -b 2048 -ub 512 \
    -npp 128 -ntg 64 -npl 1,8,64 -t 16 -ngl 99 > $R/batched-$m.txt 2> $R/batched-$m.err
  s "llama-batched-bench $m rc=$?"; grep -E '^\|' $R/batched-$m.txt >> "$S"; tail -2 $R/batched-$m.err >> "$S"
done
for m in q06 q8b; do
  [ -f /tmp/$m.gguf ] || { s "no /tmp/$m.gguf"; continue; }
  timeout 120 $L/llama-bench -m /tmp/$m.gguf -p 512 -n 128 -r 2 -ngl 99 -t 16 -o md > $R/llama-bench-$m.md 2> $R/llama-bench-$m.err
  s "llama-bench $m rc=$?"; grep -E '^\|' $R/llama-bench-$m.md >> "$S"; tail -2 $R/llama-bench-$m.err >> "$S"
done
