# Kernels of `ncu --csv --metrics gpu__time_duration.sum` summed by name over the last full
# batched step: the kernels after the second-to-last run of pick_kernel launches, through the
# last run.
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
ks = [(r[ki], float(r[vi].replace(",", ""))) for r in rows[1:]]
ends = [i for i, (k, _) in enumerate(ks) if "pick_kernel" in k and (i + 1 == len(ks) or "pick_kernel" not in ks[i + 1][0])]
print(f"{sys.argv[2]}: {len(ks)} kernels, pick runs end at {ends[-6:]}")
if len(ends) < 2: sys.exit(0)
step = ks[ends[-2] + 1:ends[-1] + 1]
agg = collections.defaultdict(lambda: [0.0, 0])
for k, v in step:
    a = agg[k.split("(")[0][:110]]; a[0] += v; a[1] += 1
print(f"step kernels {len(step)} sum us {sum(v for _, v in step) / 1e3:.1f}")
for k, (s, n) in sorted(agg.items(), key=lambda x: -x[1][0])[:int(sys.argv[3])]:
    print(f"{s / 1e3:8.1f} us {n:4d}x {s / n / 1e3:7.2f}  {k}")
