#!/usr/bin/env python3
"""What each kernel adds to a CUDA graph's critical path, from bench/cupti_trace.cpp's CSV.

A graph launch's kernels (same graph id and correlation id) on one stream form a chain; with programmatic
dependent launch a kernel starts before its predecessor ends, so its duration overlaps the chain and says
little. What it adds is its end minus the previous kernel's end (the first one: minus the launch's first
start): those increments sum to the launch's span exactly. Per graph (launches after --skip warm-up ones),
this prints the span and, per kernel name, launches per graph, the mean increment (its in-graph cost) and the
mean duration (start to end, waiting included).

  python3 bench/graph_trace.py trace.csv [--graphs N] [--skip K] [--top T] [--min-kernels M]
"""
import argparse
import collections
import csv
import re
import shutil
import subprocess
import sys


def demangle(names):
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: short(d) for n, d in zip(names, out)}


def short(d):
    d = d.replace("(anonymous namespace)::", "")
    d = re.sub(r"\blilac::cuda::", "", d)
    # drop the parameter list (the outermost parentheses at the end)
    depth = 0
    for i in range(len(d) - 1, -1, -1):
        if d[i] == ")":
            depth += 1
        elif d[i] == "(":
            depth -= 1
            if depth == 0:
                d = d[:i]
                break
    if d.startswith("void "):
        d = d[5:]
    return d.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graphs", type=int, default=4, help="graphs to show (most launched first)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up launches of each graph to skip")
    ap.add_argument("--top", type=int, default=30, help="kernel names per graph")
    ap.add_argument("--min-kernels", type=int, default=20, help="graphs with fewer kernels per launch are skipped")
    a = ap.parse_args()

    launches = collections.defaultdict(list)  # (graph, correlation) -> records
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            if r["kind"] != "K" or r["graph"] == "0":
                continue
            launches[(int(r["graph"]), int(r["correlation"]))].append(
                (int(r["start"]), int(r["end"]), int(r["stream"]), r["name"]))
    by_graph = collections.defaultdict(list)
    for (g, c), recs in launches.items():
        by_graph[g].append((min(x[0] for x in recs), recs))
    names = demangle({x[3] for recs in launches.values() for x in recs})

    shown = 0
    for g, ls in sorted(by_graph.items(), key=lambda kv: -len(kv[1])):
        ls.sort()
        ls = ls[a.skip:]
        if not ls or len(ls[0][1]) < a.min_kernels:
            continue
        inc = collections.defaultdict(float)
        dur = collections.defaultdict(float)
        cnt = collections.defaultdict(int)
        spans = []
        for t0, recs in ls:
            recs = sorted(recs, key=lambda x: x[1])
            prev = t0
            for s, e, _, n in recs:
                k = names[n]
                inc[k] += max(0, e - prev)
                dur[k] += e - s
                cnt[k] += 1
                prev = max(prev, e)
            spans.append(prev - t0)
        L = len(ls)
        span = sum(spans) / L
        print(f"graph {g}: {L} launches, {len(ls[0][1])} kernels each, span {span / 1e3:.1f} us "
              f"(min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f})")
        print(f"  {'increment us':>12} {'share':>6} {'per launch':>10} {'duration us':>11}  kernel")
        for k in sorted(inc, key=lambda k: -inc[k])[:a.top]:
            print(f"  {inc[k] / L / 1e3:12.2f} {inc[k] / L / span * 100:5.1f}% {cnt[k] / L:10.1f} "
                  f"{dur[k] / L / 1e3:11.2f}  {k[:110]}")
        shown += 1
        if shown >= a.graphs:
            break
    if shown == 0:
        print("no graph launches with enough kernels in", a.csv, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
