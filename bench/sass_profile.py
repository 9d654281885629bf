#!/usr/bin/env python3
# Summarises Nsight Compute's per-SASS-instruction counters of one kernel launch (the CSV of
# `ncu --section SourceCounters --page source --print-source sass --csv -k regex:<kernel> -c 1 <binary>`, as
# `scripts/gpu-profile.sh sass` runs it): executed instructions and stall samples per opcode, the stall
# reasons, and the instructions that hold the most stall samples with their reasons. This is how the
# multi-row MoE kernels' 64-bit divisions, register copies and scale-load stalls were found
# (bench/GPU_NOTES.md, "Multi-row MoE, third pass"). Usage: sass_profile.py ncu-sass.csv [top N]
import collections, csv, sys

lines = [l for l in open(sys.argv[1], encoding='utf-8', errors='replace') if l.startswith('"')]
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
rows = list(csv.reader(lines))
kernel = rows[0][1] if rows and rows[0][0] == 'Kernel Name' else '?'
hdr_i = next(i for i, r in enumerate(rows) if 'Source' in r and 'Instructions Executed' in r)
hdr, data = rows[hdr_i], [r for r in rows[hdr_i + 1:] if len(r) == len(rows[hdr_i])]
col = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]


def num(r, h):
    try:
        return int(float(r[col[h]].replace(',', '')))
    except (KeyError, ValueError):
        return 0


def opcode(src):
    parts = src.split()
    if parts and parts[0].startswith('@'):
        parts = parts[1:]
    return parts[0].split('.')[0] if parts else '?'


inst = [num(r, 'Instructions Executed') for r in data]
samp = [num(r, 'Warp Stall Sampling (All Samples)') for r in data]
total_i, total_s = sum(inst) or 1, sum(samp) or 1
print(f"kernel: {kernel}")
print(f"{len(data)} SASS instructions, {sum(inst):,} executed (warp level), {sum(samp):,} stall samples\n")
by_op_i, by_op_s = collections.Counter(), collections.Counter()
for r, n, s in zip(data, inst, samp):
    by_op_i[opcode(r[col['Source']])] += n
    by_op_s[opcode(r[col['Source']])] += s
print("opcode       executed   share   stall share")
for op, n in by_op_i.most_common(20):
    print(f"{op:10s} {n:11,d}  {100 * n / total_i:5.1f} %  {100 * by_op_s[op] / total_s:5.1f} %")
by_reason = collections.Counter({h: sum(num(r, h) for r in data) for h in reasons})
rs = sum(by_reason.values()) or 1
print("\nstall reason               samples   share")
for h, v in by_reason.most_common(10):
    print(f"{h:25s} {v:8,d}  {100 * v / rs:5.1f} %")
print(f"\nthe {top_n} instructions with the most stall samples (index, samples, executed, source, main reasons):")
order = sorted(range(len(data)), key=lambda i: -samp[i])[:top_n]
for i in order:
    r = data[i]
    main = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:2]
    why = ', '.join(f"{h} {v}" for v, h in main if v)
    print(f"{i:6d} {samp[i]:6d} {inst[i]:9,d}  {r[col['Source']].strip()[:60]:60s} {why}")
