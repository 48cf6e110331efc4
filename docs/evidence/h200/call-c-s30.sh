#!/usr/bin/env bash
# Session 30, call C: where batch-1 decode time goes on the H200 for the models furthest from
# issue 23's and 24's floor (gemma3-1b 0.300, granite-4.0-h-1b 0.36 of the read limit in
# session 29) next to qwen3-0.6b (0.497): test_cuda with the CLI first (HEAD's binaries), then
# per model `arbiter bench` (bf16, synth weights) and Nsight Compute's per-kernel durations
# of a short run (-p 1 -n 4: every forward is one token), summed by kernel name.
set -u
CARRY=.carry/b30
source "$(dirname "$0")/call-common.sh"
ARBITER_REQUIRE_CUDA=1 timeout 170 $B/test_cuda > "$R/test_cuda.log" 2>&1; s "test_cuda rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED|tests ran|Failure' "$R/test_cuda.log" | tail -12 >> "$S"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in gemma3-1b granite-4.0-h-1b qwen3-0.6b; do
  timeout 120 $A bench --synth $m --device cuda --dtype bf16 -p 512 -n 128 -r 2 > $R/bench-$m.txt 2>&1; s "bench $m rc=$?"
  grep -E '^\| (pp|tg)|decode  ' $R/bench-$m.txt | tr -s ' ' >> "$S"
  timeout 200 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --log-file $R/ncu-$m.csv \
    $A bench --synth $m --device cuda --dtype bf16 -p 1 -n 4 -r 1 --no-probes > $R/ncu-$m.out 2>&1; s "ncu $m rc=$?"
  python3 - "$R/ncu-$m.csv" >> "$S" 2>&1 <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    k = r["Kernel Name"].split("(")[0][:70]
    tot[k] += float(r["Metric Value"].replace(",", "")); cnt[k] += 1
allt = sum(tot.values())
print(f"kernels {sum(cnt.values())}, total {allt/1e3:.1f} us")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:14]:
    print(f"  {100*v/allt:5.1f}%  {v/cnt[k]/1e3:7.2f} us x {cnt[k]:5d}  {k}")
PY
done
