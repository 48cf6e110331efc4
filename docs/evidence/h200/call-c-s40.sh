#!/usr/bin/env bash
# Session 40, call C: measurements only (76d4941). Why gemma3-1b's decode attention takes
# ~8.8 us a layer for a few hundred KB (session 39's Nsight Compute: a quarter of a step):
# Nsight Compute's full set on two attn_decode_kernel launches of a 4-layer gemma3-1b
# (64 keys), and on qwen3-0.6b's (Dh 128) for comparison, the details page as CSV.
set -u
CARRY=.carry/b40c
source "$(dirname "$0")/call-common.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for p in gemma3-1b qwen3-0.6b; do
  ARBITER_CUDA_GRAPH=0 timeout 150 $NCU --clock-control none --kernel-name regex:attn_decode \
    --launch-skip 8 --launch-count 2 --set full -o $R/attn-$p \
    $A bench --synth $p --synth-layers 4 --device cuda --dtype bf16 -p 64 -n 4 -r 1 --no-probes \
    > $R/ncu-$p.out 2>&1; s "ncu $p rc=$?"
  $NCU --import $R/attn-$p.ncu-rep --page details --csv > $R/attn-$p.csv 2>&1
  python3 - "$R/attn-$p.csv" >> "$S" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
want = ("Duration", "Elapsed Cycles", "Registers Per Thread", "Achieved Occupancy", "Grid Size",
        "Block Size", "Dynamic Shared Memory Per Block", "Memory Throughput", "Compute (SM) Throughput",
        "Warp Cycles Per Issued Instruction", "Executed Ipc Active", "Issue Slots Busy",
        "Stall Long Scoreboard", "Stall Barrier", "Stall Wait", "Stall Short Scoreboard",
        "Stall Math Pipe Throttle", "Stall MIO Throttle", "Stall LG Throttle", "Stall Not Selected",
        "Stall Membar", "Stall Drain", "Stall Selected", "Stall Dispatch Stall", "Stall No Instruction",
        "Executed Instructions", "One or More Eligible")
seen = set()
for r in rows[1:]:
    if len(r) < len(hdr): continue
    name = r[idx.get("Metric Name", 0)]; k = (r[idx.get("ID", 0)], name)
    if any(w.lower() in name.lower() for w in want) and k not in seen:
        seen.add(k)
        print(f"  {r[idx.get('ID',0)]} {name}: {r[idx.get('Metric Value',0)]} {r[idx.get('Metric Unit',0)]}")
PY
done
