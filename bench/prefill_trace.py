#!/usr/bin/env python3
"""Kernel durations of a prompt's prefill as it runs, from bench/cupti_trace.cpp's CSV.

The prefill's kernels are launched one by one (not from a graph), so each runs between its real neighbours; this
prints what each kernel took there (start to end), unlike Nsight Compute, which serialises them. The kernels outside
graphs are cut into segments at the sampling kernels (each prefill ends with its first token's sample); the segments
with a kernel matching --marker (default: the MoE prefill kernels) are the prefills. For each (or the busiest, without
--all): its span, busy and idle time, and per kernel name the launches and the summed and mean durations.

  CUDA_INJECTION64_PATH=liblilac_cupti_trace.so LILAC_TRACE_OUT=t.csv lilac bench --synthetic --prompt-lens 512 ...
  python3 bench/prefill_trace.py t.csv [--marker REGEX] [--all] [--top N]
"""
import argparse
import collections
import csv
import re
import sys

from graph_trace import demangle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--marker", default="moe_small|moe_prefill|qgemm", help="a prefill segment has a kernel matching this")
    ap.add_argument("--all", action="store_true", help="every prefill segment, not only the longest")
    ap.add_argument("--top", type=int, default=20, help="kernel names per segment")
    ap.add_argument("--by-grid", action="store_true",
                    help="one line per kernel name, grid and stream (which shapes of a kernel cost what, and on which stream)")
    a = ap.parse_args()

    recs = []
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            if r["kind"] == "K" and r["graph"] in ("0", ""):
                key = r["name"]
                if a.by_grid:
                    key = f'{r["name"]}\t[{r["gx"]},{r["gy"]},{r["gz"]}] s{r["stream"]}'
                recs.append((int(r["start"]), int(r["end"]), key))
    recs.sort()
    segs, cur = [], []
    for x in recs:
        cur.append(x)
        if "sample" in x[2]:
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    marker = re.compile(a.marker)
    segs = [s for s in segs if any(marker.search(x[2]) for x in s)]
    if not segs:
        print("no kernel outside graphs matches", a.marker, "in", a.csv, file=sys.stderr)
        return 1
    def busy_ns(s):  # time with at least one kernel running (the segments' spans also hold host gaps)
        busy, last = 0, s[0][0]
        for b, e, _ in s:
            busy += max(0, e - max(b, last))
            last = max(last, e)
        return busy

    if not a.all:
        # the busiest segment: the longest span can be `lilac bench --synthetic`'s weight generation, mostly idle
        segs = [max(segs, key=busy_ns)]
    raw = {x[2] for s in segs for x in s}
    dem = demangle({k.split("\t")[0] for k in raw})
    names = {k: dem[k.split("\t")[0]] + ("  " + k.split("\t")[1] if "\t" in k else "") for k in raw}
    for s in segs:
        span, busy = s[-1][1] - s[0][0], busy_ns(s)
        dur = collections.defaultdict(int)
        cnt = collections.Counter()
        for b, e, n in s:
            dur[names[n]] += e - b
            cnt[names[n]] += 1
        print(f"prefill: {len(s)} kernels, span {span / 1e3:.1f} us, busy {busy / 1e3:.1f} us, idle {(span - busy) / 1e3:.1f} us")
        print(f"  {'duration us':>11} {'launches':>8} {'mean us':>8}  kernel")
        for k in sorted(dur, key=lambda k: -dur[k])[:a.top]:
            print(f"  {dur[k] / 1e3:11.1f} {cnt[k]:8d} {dur[k] / cnt[k] / 1e3:8.2f}  {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
