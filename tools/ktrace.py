#!/usr/bin/env python3
"""Read a kernel trace (KILN_CUDA_KTRACE=FILE with build-trace/kiln, see
src/backend/cuda/ktrace.cuh) and print where the traced forward's time went.

    python3 tools/ktrace.py FILE [--timeline N] [--src DIR] [--overlap KERNEL]

A launch is the set of blocks with one grid id. For each launch:
  start  its first block's start (blocks may start early, under PDL)
  wait   its first and last block's return from the wait on the kernel before
  end    its last block's exit
  adds   end minus the latest end of the launches before it: what the launch
         adds to the step's critical path (the time DRAM or SMs spend on it
         and nothing later)
The summary sums "adds" per kernel: the partition of the step's time that
says which kernel to make shorter. Kernel names come from the source lines
the records name, so read a trace against the source it was built from.
"""
import argparse
import collections
import os
import re
import sys


def kernel_names(units, src):
    """(unit, line) -> kernel name, read from the source around the KTRACE()"""
    cache = {}

    def name(unit, line):
        key = (unit, line)
        if key in cache:
            return cache[key]
        path = units.get(unit, "?")
        full = path if os.path.isabs(path) else os.path.join(src, path)
        nm = "%s:%d" % (os.path.basename(path), line)
        try:
            lines = open(full).read().split("\n")
            for i in range(line - 1, max(line - 40, 0), -1):
                if lines[i].startswith("__global__"):
                    sig = " ".join(lines[i:line])
                    m = re.search(r"(\w+)\s*\(", re.sub(r"__launch_bounds__\([^)]*\)", "", sig.split("__global__", 1)[1]))
                    if m:
                        nm = m.group(1)
                    break
        except OSError:
            pass
        cache[key] = nm
        return nm

    return name


def load(path):
    """the file's units {index: path} and records (grid, t0, tw, t1, unit,
    line, sm, block, marks): marks a tuple of ns after t0, 0 where a
    KTRACE_MARK was not reached (empty in traces from before marks)"""
    units, recs = {}, []
    for ln in open(path):
        if ln.startswith("# unit"):
            _, _, i, upath = ln.split(None, 3)
            units[int(i)] = upath.strip()
        elif not ln.startswith("#") and ln.strip():
            v = tuple(map(int, ln.split()))
            recs.append(v[:8] + (v[8:],))
    return units, recs


def marks(recs, name):
    """{kernel: [(mark, blocks that reached it, mean us after the wait)]}:
    where time goes inside the kernels that carry KTRACE_MARK"""
    acc = collections.OrderedDict()
    for r in recs:
        base = r[2] or r[1]
        for i, m in enumerate(r[8]):
            if m:
                a = acc.setdefault(name(r[4], r[5]), collections.OrderedDict()).setdefault(i, [0, 0])
                a[0] += 1
                a[1] += r[1] + m - base
    return {k: [(i, n, t / n / 1000.0) for i, (n, t) in sorted(v.items())] for k, v in acc.items()}


def launches(recs, name):
    """one dict per launch in grid-id order, times in ns from the first
    block's start; name(unit, line) names its kernel"""
    by = collections.defaultdict(list)
    for r in recs:
        by[r[0]].append(r)
    T0 = min(r[1] for r in recs)
    out = []
    for g, rs in by.items():
        tws = [r[2] for r in rs if r[2]]
        out.append(
            dict(
                grid=g,
                name=name(rs[0][4], rs[0][5]),
                blocks=len(rs),
                sms=len(set(r[6] for r in rs)),
                start=min(r[1] for r in rs) - T0,
                w0=(min(tws) - T0) if tws else None,
                w1=(max(tws) - T0) if tws else None,
                end=max(r[3] for r in rs) - T0,
            )
        )
    out.sort(key=lambda l: l["grid"])
    latest = 0
    for l in out:
        l["adds"] = max(0, l["end"] - latest)
        latest = max(latest, l["end"])
    return out


def tails(recs, ls, name, min_blocks=8):
    """{kernel: (launches, p50, p90, max)} for kernels of at least
    min_blocks blocks a launch: when its blocks end, in us after the launch's
    first wait (or first start), by nearest rank, averaged over its
    launches. A max far past the p90 is a tail: the last blocks' DRAM
    round trips with little else in flight."""
    first = {l["grid"]: l["w0"] if l["w0"] is not None else l["start"] for l in ls}
    T0 = min(r[1] for r in recs)
    ends = collections.defaultdict(list)
    for r in recs:
        ends[r[0]].append(r[3] - T0 - first[r[0]])
    acc = collections.OrderedDict()
    for l in ls:
        e = sorted(ends[l["grid"]])
        if len(e) < min_blocks:
            continue
        q = lambda f: e[max(0, -(-len(e) * f // 100) - 1)]
        a = acc.setdefault(l["name"], [0, 0, 0, 0])
        a[0] += 1
        a[1] += q(50)
        a[2] += q(90)
        a[3] += e[-1]
    return {k: (n, p50 / n / 1000.0, p90 / n / 1000.0, mx / n / 1000.0) for k, (n, p50, p90, mx) in acc.items()}


def overlap(recs, ls, kernel, step=1000):
    """kernel's launches against the launch after each, every step ns from
    the kernel's first wait (its first start where no block waits): mean
    over those launches of (us, its blocks running, the next launch's blocks
    resident, of those still before their wait). Shows what the next
    kernel's early blocks do while this one's last blocks run. Returns
    (launches, the next launches' names, rows)."""
    by = collections.defaultdict(list)
    for r in recs:
        by[r[0]].append(r)
    acc = collections.defaultdict(lambda: [0, 0, 0])
    n, nxt = 0, collections.Counter()
    for l, l2 in zip(ls, ls[1:]):
        if l["name"] != kernel:
            continue
        a, b = by[l["grid"]], by[l2["grid"]]
        tws = [r[2] for r in a if r[2]]
        o = min(tws) if tws else min(r[1] for r in a)
        end = max(r[3] for r in a + b)
        n += 1
        nxt[l2["name"]] += 1
        for t in range(0, max(0, end - o) // step + 1):
            T = o + t * step
            row = acc[t]
            row[0] += sum(1 for r in a if r[1] <= T < r[3])
            row[1] += sum(1 for r in b if r[1] <= T < r[3])
            row[2] += sum(1 for r in b if r[1] <= T < r[3] and r[2] > T)
    rows = [(t * step / 1000.0, v[0] / n, v[1] / n, v[2] / n) for t, v in sorted(acc.items())]
    return n, sorted(nxt), rows


def per_kernel(ls):
    """{kernel: launches n, adds, span, blocks} summed over its launches"""
    agg = collections.OrderedDict()
    for l in ls:
        s = agg.setdefault(l["name"], dict(n=0, adds=0, span=0, blocks=0))
        s["n"] += 1
        s["adds"] += l["adds"]
        s["blocks"] += l["blocks"]
        s["span"] += l["end"] - (l["w0"] if l["w0"] is not None else l["start"])
    return agg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--timeline", type=int, default=40, help="launches to list one by one (default 40)")
    ap.add_argument("--src", default=".", help="the repository root the unit paths are relative to")
    ap.add_argument("--overlap", metavar="KERNEL", help="per us after KERNEL's wait: its blocks running, and the next launch's")
    a = ap.parse_args()

    units, recs = load(a.file)
    if not recs:
        sys.exit("ktrace: no records in %s" % a.file)
    name = kernel_names(units, a.src)
    ls = launches(recs, name)
    step = max(l["end"] for l in ls)

    us = lambda ns: "%8.2f" % (ns / 1000.0) if ns is not None else "       -"
    print("%d launches, %d blocks, step %.1f us (first block start to last block end)" % (len(ls), len(recs), step / 1000.0))
    print()
    print("  #  kernel                  blocks  SMs    start   wait0   wait1      end     adds")
    for i, l in enumerate(ls[: a.timeline]):
        print(
            "%3d  %-22s %7d %4d %s %s %s %s %s"
            % (i, l["name"][:22], l["blocks"], l["sms"], us(l["start"]), us(l["w0"]), us(l["w1"]), us(l["end"]), us(l["adds"]))
        )
    print()
    print("kernel                  launches  blocks/launch  span/launch (us)  adds/launch (us)  adds total (us)  share")
    for k, s in sorted(per_kernel(ls).items(), key=lambda kv: -kv[1]["adds"]):
        print(
            "%-22s %9d %14.0f %17.2f %17.2f %16.1f %5.1f%%"
            % (k[:22], s["n"], s["blocks"] / s["n"], s["span"] / s["n"] / 1000.0, s["adds"] / s["n"] / 1000.0, s["adds"] / 1000.0, 100.0 * s["adds"] / step)
        )
    tl = tails(recs, ls, name)
    if tl:
        print()
        print("block ends, us after the launch's first wait (mean over launches of >= 8 blocks): p50, p90, last")
        for k, (n, p50, p90, mx) in sorted(tl.items(), key=lambda kv: -kv[1][3]):
            print("%-22s %9d %8.2f %8.2f %8.2f" % (k[:22], n, p50, p90, mx))
    if a.overlap:
        n, nxt, rows = overlap(recs, ls, a.overlap)
        print()
        if not n:
            print("no launch of %s with a launch after it (names come from --src)" % a.overlap)
        else:
            print("%s against the launch after it (%s), per us after its first wait, mean over %d launches:" % (a.overlap, ", ".join(nxt), n))
            print("    us  running  next resident  next before its wait")
            for t, run, res, pre in rows:
                print("%6.1f %8.1f %14.1f %21.1f" % (t, run, res, pre))
    mk = marks(recs, name)
    if mk:
        print()
        print("marks inside kernels: mark, blocks that reached it, mean us after the block's wait (or start)")
        for k, v in mk.items():
            print("%-22s %s" % (k[:22], "  ".join("%d: %d x %.2f" % m for m in v)))


if __name__ == "__main__":
    main()
