#!/usr/bin/env bash
# Session 33, call F: where a hybrid's decode step goes after this session's routing kernel,
# for the next session's plan: Nsight Compute's per-kernel time and DRAM bytes of the last
# step of a 4-layer synth bf16 run (call-a-s26-agg.py), graphs off, of granite-4.0-h-tiny,
# granite-4.0-h-1b and nemotron-3-nano-30b-a3b.
set -u
CARRY=.carry/b33f
source "$(dirname "$0")/call-common.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in granite-4.0-h-tiny granite-4.0-h-1b nemotron-3-nano-30b-a3b; do
  ARBITER_CUDA_GRAPH=0 timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file $R/ncu-$m.csv \
    $A bench --synth $m --synth-layers 4 --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m (4 layers) rc=$?"
  python3 docs/evidence/h200/call-a-s26-agg.py $R/ncu-$m.csv >> "$S" 2>&1
done
