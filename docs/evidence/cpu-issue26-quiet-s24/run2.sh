#!/usr/bin/env bash
# Quiet-host CPU decode of Q4_K_M and Q8_0 (issue 26 item 5): arbiter and llama.cpp 80fb11a's
# CPU-only build (llama-bench) on the same synth GGUFs, interleaved, 2 threads.
set -u
A=/work/main/build-cuda/src/arbiter
L=/tmp/peers/llama.cpp/build-cpu/bin
O=/tmp/cpumeas2; mkdir -p $O
{ date -u; nproc; } > $O/host.txt
for r in 1 2; do
  for d in q4_k_m q8_0; do
    uptime >> $O/host.txt
    $A bench -m /tmp/cpu-q06-$d.gguf --device cpu -t 2 -p 32 -n 16 -r 3 --json-out $O/arbiter-$d-$r.json > $O/arbiter-$d-$r.txt 2>&1
    LD_LIBRARY_PATH=$L $L/llama-bench -m /tmp/cpu-q06-$d.gguf -t 2 -p 32 -n 16 -r 3 -o md > $O/llama-$d-$r.md 2> $O/llama-$d-$r.err
  done
done
uptime >> $O/host.txt
