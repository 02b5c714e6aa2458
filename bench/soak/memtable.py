#!/usr/bin/env python3
"""Markdown tables from bench/soak/memory.sh result files (JSON lines): memtable.py FILE...
Rows keep the order of the files; a later (allocator, mode) pair with the same name is listed
again, so label runs apart (memory.sh LABEL=...)."""
import json, sys
rows = [json.loads(l) for path in sys.argv[1:] for l in open(path) if l.strip()]
keys = []
for r in rows:
    k = (r["allocator"], r["mode"])
    if k not in keys:
        keys.append(k)
def mib(k):
    return f"{k / 1024:.1f}"
print("Idle clients (a fresh mongoguard per row):")
print()
print("| allocator | mode | clients | RSS at rest MiB | RSS idle MiB | KiB per idle client | RSS after close MiB | fds idle / after close |")
print("|---|---|---:|---:|---:|---:|---:|---|")
for a, m in keys:
    for r in rows:
        if r["allocator"] == a and r["mode"] == m and r["step"].startswith("idle-"):
            print(f"| {a} | {m} | {r['clients']:,} | {mib(r['rss_before_kib'])} | {mib(r['rss_idle_kib'])} | "
                  f"{r['per_client_kib']:.1f} | {mib(r['rss_after_close_kib'])} | {r.get('fds_idle')} / {r.get('fds_after_close')} |")
print()
print("Burst (clients x MiB insert, rounds) then a loadgen point, on one fresh mongoguard:")
print()
print("| allocator | mode | RSS at rest MiB | burst peak MiB | after burst MiB | insert ops/s | find ops/s | mongoguard CPU µs/op | RSS after load MiB |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for a, m in keys:
    rs = {r["step"]: r for r in rows if r["allocator"] == a and r["mode"] == m}
    b, l = rs.get("burst", {}), rs.get("load", {})
    start, end = rs.get("start", {}).get("rss_kib"), rs.get("end", {}).get("rss_kib")
    print(f"| {a} | {m} | {mib(start) if start else '-'} | {mib(b['rss_peak_kib']) if b else '-'} | "
          f"{mib(b['rss_after_kib']) if b else '-'} | {l.get('insert_ops_s', '-')} | {l.get('find_ops_s', '-')} | "
          f"{l.get('cpu_us_per_op', '-')} | {mib(end) if end else '-'} |")
