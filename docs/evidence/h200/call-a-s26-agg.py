# ncu --csv with gpu__time_duration.sum and dram__bytes_read.sum: the kernels of the last decode
# step (after the second-to-last pick kernel), summed by name: time, GB read, GB/s.
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value"); ii = h.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault(r[ii], [r[ki], {}])[1][r[mi]] = float(r[vi].replace(",", ""))
ks = list(by.values())
ends = [i for i, (k, _) in enumerate(ks) if "pick" in k]
if len(ends) < 2: print("no steps", len(ks)); sys.exit(0)
step = ks[ends[-2] + 1:ends[-1] + 1]
agg = collections.defaultdict(lambda: [0.0, 0.0, 0])
for k, m in step:
    a = agg[k.split("(")[0][:100]]
    a[0] += m.get("gpu__time_duration.sum", 0); a[1] += m.get("dram__bytes_read.sum", 0); a[2] += 1
tt = sum(a[0] for a in agg.values()); tb = sum(a[1] for a in agg.values())
print(f"step: {len(step)} kernels, {tt/1e3:.1f} us, {tb/1e9:.3f} GB read, {tb/tt:.0f} GB/s")
for k, (t, b, n) in sorted(agg.items(), key=lambda x: -x[1][0])[:16]:
    print(f"{t/1e3:8.1f} us {n:4d}x {t/n/1e3:7.2f} {b/1e6:9.1f} MB {b/t:6.0f} GB/s  {k}")
