#!/usr/bin/env python3
"""Summarises bench/prof/pooled.sh's lines (read from stdin or the files given): per op and
per mode, the ratio against passthrough ("pass") of each round, ops/s, mongoguard's CPU per
request, and the CPU per request of the three processes together (mongoguard, the stand-in,
loadgen), with the median over the rounds. On this shared two-core machine a single round's
ops/s ratio swings by up to ±0.3 in a slow phase; the medians, and the three-process CPU per
request (the throughput a CPU-bound machine can reach is its inverse), are the figures.
"""
import re
import statistics
import sys

LINE = re.compile(
    r"round (\d+): (\S+) (\w+) x\d+: ops/s=(\d+) .*?total=([\d.]+) us/req "
    r"upstream=([\d.]+) loadgen=([\d.]+)"
)


def main():
    runs = {}
    sources = [open(f) for f in sys.argv[1:]] or [sys.stdin]
    for src in sources:
        for line in src:
            m = LINE.search(line)
            if m:
                rnd, mode, op, ops, mg, up, lg = m.groups()
                runs[(int(rnd), mode, op)] = (int(ops), float(mg), float(mg) + float(up) + float(lg))
    ops_seen = sorted({k[2] for k in runs})
    modes = sorted({k[1] for k in runs} - {"pass"})
    for op in ops_seen:
        for mode in modes:
            rounds = sorted(r for (r, m, o) in runs if m == mode and o == op and (r, "pass", op) in runs)
            if not rounds:
                continue
            ratio = lambda i: [runs[(r, mode, op)][i] / runs[(r, "pass", op)][i] for r in rounds]
            thr, mg, three = ratio(0), ratio(1), ratio(2)
            fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)
            print(
                f"{op} {mode}/pass over {len(rounds)} rounds: ops/s {fmt(thr)} (median "
                f"{statistics.median(thr):.2f}); mongoguard CPU/req median "
                f"{statistics.median(mg):.2f}; three processes' CPU/req median "
                f"{statistics.median(three):.2f}"
            )


if __name__ == "__main__":
    main()
