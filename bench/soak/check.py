#!/usr/bin/env python3
"""The soak's ledger check and report (bench/soak.sh).

  check.py snapshot --uri URI --db soak --coll C [--coll C2 ...] --out FILE
      Reads every _id of each collection straight from a stand-in member (not through
      mongoguard) and writes {"t_start", "t_end", "ids": {coll: [_id, ...]}}. t_start is taken
      before the first read: every insert acknowledged before it must be in the snapshot.

  check.py stepdown --uri URI --event-log FILE [--gap-ms 1000]
      Sends {standinStepDown: 1} to a stand-in member and logs the event.

  check.py check --run-dir DIR --target NAME=COLL [...] [--warmup-min 1]
      DIR holds events.jsonl (written by soak.sh), ledger-NAME.tsv (driver.py), snap-E.json
      (one per store epoch) and rss.tsv. Prints the per-minute table, the events with the time
      to the next acknowledged write, the ledger verdict per target, and exits 1 when a write
      was lost, doubled, or a document appears that no ledger line accounts for, or (with
      --resume-limit S) when a mode acknowledged no insert sent after a step-down or kill
      within S seconds.

Store epochs. The stand-in keeps its data in memory: a kill -9 destroys it. Each kill closes an
epoch: soak.sh takes a snapshot right before the kill (S_e), kills (K_e), waits, restarts
(R_e). The last epoch's snapshot is taken after the drivers have stopped. An insert whose
answer came at t_done belongs to the epoch e with R_(e-1) < t_done (the old process is dead
from K_(e-1) on, so a later answer was produced by the new one) and
  - t_done <= S_e: it must be in snapshot e, exactly once (else lost / doubled);
  - S_e < t_done <= R_e: its store was destroyed before it could be read: counted as
    "unverifiable (acknowledged between the last snapshot and the kill)".
Every snapshot is also checked for _ids present more than once and for _ids that no ledger
line names.
"""
import argparse
import bisect
import collections
import json
import os
import sys
import time


def cmd_snapshot(a):
    import pymongo

    client = pymongo.MongoClient(a.uri, directConnection=True, readPreference="secondaryPreferred",
                                 serverSelectionTimeoutMS=10000, socketTimeoutMS=120000)
    t_start = time.time()
    ids = {}
    for c in a.coll:
        ids[c] = [d["_id"] for d in client[a.db][c].find({}, {"_id": 1}, batch_size=10000)]
    out = {"t_start": t_start, "t_end": time.time(), "ids": ids}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, a.out)
    client.close()
    if a.event_log:
        with open(a.event_log, "a") as f:
            f.write(json.dumps({"t": t_start, "kind": a.kind, "file": os.path.basename(a.out),
                                "counts": {c: len(v) for c, v in ids.items()}}) + "\n")
    print(json.dumps({"snapshot": a.out, "t_start": t_start, "seconds": round(out["t_end"] - t_start, 2),
                      "counts": {c: len(v) for c, v in ids.items()}}))


def cmd_stepdown(a):
    """{standinStepDown: 1} on one member; appends a stepdown event with the new primary."""
    import pymongo

    client = pymongo.MongoClient(a.uri, directConnection=True, serverSelectionTimeoutMS=10000)
    sent = time.time()
    reply = client.admin.command({"standinStepDown": 1, "gapMs": a.gap_ms})
    # The stand-in has stepped down when it replies: from here on no write is accepted until
    # the new primary is elected (gapMs later), so the event's time is the reply's.
    t = time.time()
    client.close()
    with open(a.event_log, "a") as f:
        f.write(json.dumps({"t": t, "kind": "stepdown", "new_primary": reply["newPrimary"],
                            "gap_ms": a.gap_ms, "sent": sent}) + "\n")
    print(json.dumps({"stepdown": True, "new_primary": reply["newPrimary"]}))


def load_events(path):
    ev = []
    if os.path.exists(path):
        with open(path) as f:
            ev = [json.loads(l) for l in f if l.strip()]
    return ev


def epochs_of(events):
    """[(R_prev, S_e, R_e, snapshot file)], in order."""
    out = []
    r_prev = float("-inf")
    snap = None
    s_t = None
    for e in events:
        if e["kind"] == "snapshot":
            snap, s_t = e["file"], e["t"]
        elif e["kind"] == "restart":
            if snap is None:
                raise SystemExit("events.jsonl: a restart without a snapshot before it")
            out.append((r_prev, s_t, e["t"], snap))
            r_prev = e["t"]
            snap = s_t = None
        elif e["kind"] == "final-snapshot":
            out.append((r_prev, e["t"], float("inf"), e["file"]))
            r_prev = None
    if r_prev is not None:
        raise SystemExit("events.jsonl: no final-snapshot event (the run did not finish)")
    return out


def read_ledger(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                raise SystemExit(f"{path}:{n}: malformed ledger line {line!r}")
            rows.append((parts[0], parts[1], float(parts[2]), float(parts[3]), parts[4]))
    return rows


def check_target(run_dir, name, coll, epochs):
    ledger = read_ledger(os.path.join(run_dir, f"ledger-{name}.tsv"))
    snaps = []
    for (_, s_t, _, file) in epochs:
        with open(os.path.join(run_dir, file)) as f:
            snap = json.load(f)
        if abs(snap["t_start"] - s_t) > 1e-3:
            raise SystemExit(f"{file}: t_start {snap['t_start']} differs from its event {s_t}")
        snaps.append(collections.Counter(snap["ids"].get(coll, [])))
    known = {row[1] for row in ledger}
    res = collections.Counter()
    lost, doubled, unknown = [], [], []
    for row in ledger:
        status, _id, _t_send, t_done, _err = row
        res[status] += 1
        if status not in ("ack", "dup"):
            continue
        e = next((i for i, (r_prev, _, r_e, _) in enumerate(epochs) if r_prev < t_done <= r_e), None)
        if e is None:
            raise SystemExit(f"ledger {name}: {_id} answered at {t_done}, outside every epoch")
        _, s_t, _, _ = epochs[e]
        if t_done > s_t:
            res[f"{status}_unverifiable"] += 1
            continue
        n = snaps[e][_id]
        if n == 0:
            lost.append((status, _id, e))
        res[f"{status}_verified"] += 1
    for e, snap in enumerate(snaps):
        for _id, n in snap.items():
            if n > 1:
                doubled.append((_id, e, n))
            if _id not in known:
                unknown.append((_id, e))
    err_present = 0
    for row in ledger:
        if row[0] == "err":
            e = next((i for i, (r_prev, _, r_e, _) in enumerate(epochs) if r_prev < row[3] <= r_e), None)
            if e is not None and row[3] <= epochs[e][1] and snaps[e][row[1]] > 0:
                err_present += 1
    return {
        "target": name, "collection": coll, "ledger_lines": len(ledger),
        "ack": res["ack"], "dup": res["dup"], "err": res["err"],
        "verified": res["ack_verified"] + res["dup_verified"],
        "unverifiable": res["ack_unverifiable"] + res["dup_unverifiable"],
        "err_but_present": err_present,
        "lost": len(lost), "doubled": len(doubled), "unknown": len(unknown),
        "lost_examples": lost[:5], "doubled_examples": doubled[:5], "unknown_examples": unknown[:5],
    }, ledger


def fmt_mib(kib):
    return f"{int(kib) / 1024:.1f}" if kib not in (None, "") else "-"


def slope(points):
    """Least-squares slope of (x, y) points, or None."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def cmd_check(a):
    run_dir = a.run_dir
    events = load_events(os.path.join(run_dir, "events.jsonl"))
    epochs = epochs_of(events)
    targets = [t.split("=", 1) for t in a.target]
    start = next((e["t"] for e in events if e["kind"] == "start"), None)
    if start is None:
        raise SystemExit("events.jsonl: no start event")

    results, ledgers = [], {}
    for name, coll in targets:
        r, ledger = check_target(run_dir, name, coll, epochs)
        results.append(r)
        ledgers[name] = ledger

    # RSS samples: t, minute, then one column per target (KiB).
    rss = []
    rss_path = os.path.join(run_dir, "rss.tsv")
    if os.path.exists(rss_path):
        with open(rss_path) as f:
            head = f.readline().rstrip("\n").split("\t")
            for line in f:
                rss.append(dict(zip(head, line.rstrip("\n").split("\t"))))

    per_min = {name: collections.Counter() for name, _ in targets}
    for name, ledger in ledgers.items():
        for status, _id, t_send, t_done, err in ledger:
            per_min[name][(int((t_done - start) // 60), status)] += 1
    ev_min = collections.defaultdict(list)
    for e in events:
        if e["kind"] in ("stepdown", "kill", "restart"):
            ev_min[int((e["t"] - start) // 60)].append(e["kind"] + (f"->{e['new_primary']}" if "new_primary" in e else ""))
    minutes = sorted({int(r["minute"]) for r in rss} | {m for c in per_min.values() for (m, _) in c})

    print("## Per minute")
    print()
    cols = " | ".join(f"{n} RSS MiB | {n} acks | {n} errors" for n, _ in targets)
    print(f"| minute | {cols} | events |")
    print("|---:|" + "---:|" * (3 * len(targets)) + "---|")
    rss_by_min = {int(r["minute"]): r for r in rss}
    for m in minutes:
        cells = []
        for n, _ in targets:
            cells += [fmt_mib(rss_by_min.get(m, {}).get(n)), str(per_min[n][(m, "ack")] + per_min[n][(m, "dup")]),
                      str(per_min[n][(m, "err")])]
        print(f"| {m} | " + " | ".join(cells) + f" | {', '.join(ev_min.get(m, []))} |")
    print()

    print("## Events: seconds from each event to the next acknowledged insert sent after it")
    print()
    print("| t (s) | event | " + " | ".join(n for n, _ in targets) + " |")
    print("|---:|---|" + "---:|" * len(targets))
    acks_sent = {n: sorted((row[2], row[3]) for row in l if row[0] == "ack") for n, l in ledgers.items()}
    stop = next((e["t"] for e in events if e["kind"] == "stop"), None)
    slow = []
    for e in events:
        if e["kind"] not in ("stepdown", "kill"):
            continue
        cells = []
        for n, _ in targets:
            xs = acks_sent[n]
            i = bisect.bisect_right(xs, (e["t"], float("inf")))
            waited = xs[i][1] - e["t"] if i < len(xs) else None
            cells.append("never" if waited is None else f"{waited:.1f}")
            if a.resume_limit > 0:
                # "never" counts only when the run went on for longer than the limit.
                if waited is None and stop is not None and stop - e["t"] <= a.resume_limit:
                    continue
                if waited is None or waited > a.resume_limit:
                    slow.append((n, e["kind"], round(e["t"] - start), "never" if waited is None else round(waited, 1)))
        label = e["kind"] + (f" (new primary {e['new_primary']})" if "new_primary" in e else "")
        print(f"| {e['t'] - start:.0f} | {label} | " + " | ".join(cells) + " |")
    print()

    print("## RSS trend after warm-up")
    print()
    for n, _ in targets:
        pts = [(int(r["minute"]), int(r[n])) for r in rss if r.get(n) and int(r["minute"]) >= a.warmup_min]
        s = slope(pts)
        if not pts:
            print(f"- {n}: no samples after minute {a.warmup_min}")
            continue
        lo, hi = min(y for _, y in pts), max(y for _, y in pts)
        print(f"- {n}: {len(pts)} samples from minute {a.warmup_min}: min {fmt_mib(lo)} MiB, max {fmt_mib(hi)} MiB, "
              f"slope {'-' if s is None else f'{s:+.0f} KiB/min'}")
    print()

    print("## Ledger")
    print()
    print("| target | inserts | ack | dup (retry hit an applied insert) | err | verified | unverifiable (acked after the pre-kill snapshot) | err but present | **lost** | **doubled** | **unknown docs** |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    for r in results:
        print(f"| {r['target']} | {r['ledger_lines']} | {r['ack']} | {r['dup']} | {r['err']} | {r['verified']} | {r['unverifiable']} "
              f"| {r['err_but_present']} | {r['lost']} | {r['doubled']} | {r['unknown']} |")
        if r["lost"] or r["doubled"] or r["unknown"]:
            failed = True
    print()
    for r in results:
        for k in ("lost_examples", "doubled_examples", "unknown_examples"):
            if r[k]:
                print(f"- {r['target']} {k.replace('_', ' ')}: {r[k]}")
    print(f"epochs (store lifetimes between kills): {len(epochs)}")
    with open(os.path.join(run_dir, "verdict.json"), "w") as f:
        json.dump({"failed": failed, "results": results}, f)
    print("LEDGER: FAIL (lost, doubled or unknown writes)" if failed else "LEDGER: OK (nothing acknowledged lost, nothing doubled)")
    if a.resume_limit > 0:
        for n, kind, t, waited in slow:
            print(f"- {n}: no acknowledged insert within {a.resume_limit:g} s after the {kind} at {t} s (waited: {waited})")
        print(f"RESUME: FAIL ({len(slow)} events)" if slow else f"RESUME: OK (every mode acknowledged a new insert within {a.resume_limit:g} s of every event)")
    return 1 if failed or slow else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("--uri", required=True)
    s.add_argument("--db", default="soak")
    s.add_argument("--coll", action="append", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--event-log", help="append a snapshot event here")
    s.add_argument("--kind", default="snapshot", choices=["snapshot", "final-snapshot"])
    sd = sub.add_parser("stepdown")
    sd.add_argument("--uri", required=True)
    sd.add_argument("--gap-ms", type=int, default=1000)
    sd.add_argument("--event-log", required=True)
    c = sub.add_parser("check")
    c.add_argument("--run-dir", required=True)
    c.add_argument("--target", action="append", required=True, help="NAME=COLLECTION")
    c.add_argument("--warmup-min", type=int, default=1)
    c.add_argument("--resume-limit", type=float, default=0.0,
                   help="fail when a mode acknowledges no insert sent after an event within this many seconds (0: off)")
    a = p.parse_args()
    if a.cmd == "snapshot":
        cmd_snapshot(a)
        return 0
    if a.cmd == "stepdown":
        cmd_stepdown(a)
        return 0
    return cmd_check(a)


if __name__ == "__main__":
    sys.exit(main())
