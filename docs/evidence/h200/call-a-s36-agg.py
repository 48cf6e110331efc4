# ncu --csv with gpu__time_duration.sum of a whole run: every kernel summed by name (time,
# launches, time a launch, share), largest first.
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value")
agg = collections.defaultdict(lambda: [0.0, 0])
for r in rows[1:]:
    if r[mi] != "gpu__time_duration.sum": continue
    a = agg[r[ki].split("(")[0][:90]]
    a[0] += float(r[vi].replace(",", "")); a[1] += 1
tt = sum(a[0] for a in agg.values())
print(f"all: {sum(a[1] for a in agg.values())} kernels, {tt/1e3:.1f} us")
for k, (t, n) in sorted(agg.items(), key=lambda x: -x[1][0])[:14]:
    print(f"{t/1e3:9.1f} us {100*t/tt:5.1f}% {n:4d}x {t/n/1e3:8.2f}  {k}")
