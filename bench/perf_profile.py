#!/usr/bin/env python3
# Summarises Nsight Compute per-kernel times (CSV from `ncu --csv --page raw --metrics gpu__time_duration.sum` over
# `lilac bench --synthetic --layers N --prompt-lens P --decode-tokens 2`, as scripts/gpu-profile.sh runs it): the
# launches split into segments after each sampling kernel (warm-up prefill + sample, prompt prefill + sample,
# decode steps), then per kernel name: the warm-up prefill (16 tokens), the largest segment (the prompt's prefill)
# and the last decode step. Usage: perf_profile.py ncu.csv
# Or per round of something that runs many times (scripts/gpu-profile.sh verify: the speculative verify): every kernel's
# total divided by the launches of the kernel matching REGEX (one per round, e.g. verify_accept), kernels whose names
# match ONLY (default: all). Usage: perf_profile.py ncu.csv --per REGEX [--only REGEX]
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; data = [r for r in rows[hdr + 2:] if len(r) == len(h)]
ki, ti = h.index('Kernel Name'), h.index('gpu__time_duration.sum')
def t(r): return float(r[ti].replace(',', '')) / 1000.0
def opt(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv[:-1] else None
if opt('--per'):
    per, only = re.compile(opt('--per')), re.compile(opt('--only') or '.')
    rounds = sum(1 for r in data if per.search(r[ki]))
    if rounds == 0: sys.exit(f"no launch of a kernel matching {opt('--per')}")
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for r in data:
        if only.search(r[ki]):
            n = r[ki].split('(')[0][:80]; tot[n] += t(r); cnt[n] += 1
    print(f"{rounds} rounds; per round ({sum(tot.values()) / rounds:.1f} us in all):")
    for n, v in sorted(tot.items(), key=lambda x: -x[1]):
        print(f"{v / rounds:10.1f} us {cnt[n] / rounds:6.1f}x {v / cnt[n]:9.2f} us/launch  {n}")
    sys.exit(0)
segs, cur = [], []
for i, r in enumerate(data):
    cur.append(r)
    nxt_sample = i + 1 < len(data) and 'sample' in data[i + 1][ki]
    if 'sample' in r[ki] and not nxt_sample:
        segs.append(cur); cur = []
if cur: segs.append(cur)
print("segments (split after each sampling kernel):")
for i, s in enumerate(segs):
    print(f"  seg {i}: {len(s)} kernels, {sum(t(r) for r in s):.1f} us")
def detail(title, s):
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for r in s:
        n = r[ki].split('(')[0][:80]; tot[n] += t(r); cnt[n] += 1
    print(f"\n{title}: {len(s)} kernels, {sum(tot.values()):.1f} us")
    for n, v in sorted(tot.items(), key=lambda x: -x[1]):
        print(f"{v:10.1f} us {cnt[n]:5d}x {v/cnt[n]:9.2f} us/launch  {n}")
detail("segment 0 (warm-up: 16-token prefill + first sample)", segs[0])
big = max(range(len(segs)), key=lambda i: sum(t(r) for r in segs[i]))
detail(f"segment {big} (the largest: the prompt's prefill + first sample)", segs[big])
detail(f"segment {len(segs)-1} (the last decode step)", segs[-1])
