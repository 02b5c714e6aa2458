"""Serverless-style load with pymongo: every operation constructs a new MongoClient(uri),
runs one command (ping on the admin database) and closes the client.

    python pymongo_serverless.py --uri URI --concurrency N --duration S --warmup S
        [--mode process|thread] [--label NAME]

Closed loop: N workers (separate processes by default: closer to N serverless instances,
each with its own interpreter, GIL and driver state; --mode thread runs N threads in one
process), each repeating the operation back to back. All workers start together; operations
that *complete* in the measured window (after the warmup, for --duration seconds) count for
ops/s and the latency percentiles. Every operation started is finished before the workers
exit, and "ops_all" counts them all (warmup included), so per-operation server counters can
be divided by it. "client_cpu_s" is the CPU time (user + system) of this process and its
worker processes, startup and warmup included. Prints one JSON object on stdout.

Nothing is tuned: MongoClient(uri) with the URI's options only. Note that pymongo keeps the
SCRAM key cache per MongoClient (pymongo/auth_shared.py: a new _Cache() per credential), so
every new client runs PBKDF2 at the server's iteration count once.
"""

import argparse
import json
import multiprocessing
import sys
import threading
import time


def run_worker(uri, command, start_at, warm_end, end, out):
    """Runs the loop until `end` (time.time() seconds); puts (latencies in window, ops_all,
    errors, first_error) on `out` (a queue) or returns it."""
    from pymongo import MongoClient

    while time.time() < start_at:
        time.sleep(0.001)
    lat = []
    ops_all = 0
    errors = 0
    first_error = None
    while True:
        t0 = time.time()
        if t0 >= end:
            break
        p0 = time.perf_counter()
        ok = True
        try:
            client = MongoClient(uri)
            try:
                client.admin.command(command)
            finally:
                client.close()
        except Exception as e:  # noqa: BLE001 - counted and reported
            ok = False
            errors += 1
            if first_error is None:
                first_error = f"{type(e).__name__}: {e}"[:300]
        dt = time.perf_counter() - p0
        ops_all += 1
        t1 = time.time()
        if ok and warm_end <= t1 <= end:
            lat.append(dt)
    result = (lat, ops_all, errors, first_error)
    if out is not None:
        out.put(result)
    return result


def pct(sorted_vals, q):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--mode", choices=["process", "thread"], default="process")
    ap.add_argument("--command", default="ping")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    import pymongo  # imported before forking, so workers do not each pay the import

    start_at = time.time() + 1.0
    warm_end = start_at + a.warmup
    end = warm_end + a.duration
    results = []
    if a.mode == "process":
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=run_worker, args=(a.uri, a.command, start_at, warm_end, end, q))
                 for _ in range(a.concurrency)]
        for p in procs:
            p.start()
        for _ in procs:
            results.append(q.get())
        for p in procs:
            p.join()
    else:
        lock = threading.Lock()

        def th():
            r = run_worker(a.uri, a.command, start_at, warm_end, end, None)
            with lock:
                results.append(r)

        ts = [threading.Thread(target=th) for _ in range(a.concurrency)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    import resource
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu_s = sum(r.ru_utime + r.ru_stime for r in ru)
    lat = sorted(x for r in results for x in r[0])
    errors = sum(r[2] for r in results)
    first_error = next((r[3] for r in results if r[3]), None)
    us = lambda v: None if v is None else round(v * 1e6)
    print(json.dumps({
        "driver": "pymongo",
        "driver_version": pymongo.version,
        "python": sys.version.split()[0],
        "label": a.label,
        "mode": a.mode,
        "concurrency": a.concurrency,
        "duration_s": a.duration,
        "warmup_s": a.warmup,
        "ops_total": len(lat),
        "ops_per_sec": len(lat) / a.duration,
        "ops_all": sum(r[1] for r in results),
        "p50_us": us(pct(lat, 0.50)),
        "p99_us": us(pct(lat, 0.99)),
        "mean_us": us(sum(lat) / len(lat)) if lat else None,
        "client_cpu_s": cpu_s,
        "errors": errors,
        "first_error": first_error,
    }))


if __name__ == "__main__":
    main()
