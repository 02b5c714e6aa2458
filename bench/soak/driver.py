#!/usr/bin/env python3
"""Soak load driver: mixed load through one mongoguard with pymongo (retryable writes on), and an
acknowledged-write ledger.

Writer threads loop: insert one document with a unique _id into the ledger collection, then
(every few iterations) an update on a counters collection, a find of a recent _id and an
aggregate. Reader threads loop on finds and a count. Every insert gets one ledger line, written
and flushed after the driver's answer:

    status <TAB> _id <TAB> t_send <TAB> t_done <TAB> error

  status ack  the driver reported the insert acknowledged (the document must exist)
         dup  duplicate key (11000): an earlier attempt of this insert was applied (a retry
              whose first attempt had been applied: the stand-in does not deduplicate retryable
              writes by txnNumber as mongod does), so the document exists
         err  any other error: outcome unknown (the document may or may not exist)
  t_send / t_done: time.time() before the call and after the answer.

Every --progress seconds one JSON line goes to stdout: counts of ack, dup, err and read
successes/errors since the start, and the error classes. SIGTERM / SIGINT stop the threads after
their current operation; the ledger is complete when the process exits 0.

Usage: driver.py --uri URI --name NAME --ledger FILE [--writers 4] [--readers 2]
                 [--db soak] [--coll NAME] [--rate 0] [--progress 10]
"""
import argparse
import collections
import json
import os
import random
import signal
import sys
import threading
import time

import pymongo
from pymongo.errors import DuplicateKeyError, PyMongoError

STOP = threading.Event()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--db", default="soak")
    p.add_argument("--coll", default=None, help="ledger collection (default ledger_NAME)")
    p.add_argument("--rate", type=float, default=0.0, help="inserts/s per writer (0: unthrottled)")
    p.add_argument("--progress", type=float, default=10.0)
    a = p.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    signal.signal(signal.SIGINT, lambda *_: STOP.set())

    client = pymongo.MongoClient(
        a.uri,
        retryWrites=True,
        retryReads=True,
        serverSelectionTimeoutMS=5000,
        connectTimeoutMS=3000,
        socketTimeoutMS=15000,
        maxPoolSize=a.writers + a.readers + 2,
        appname=f"soak-{a.name}",
    )
    db = client[a.db]
    ledger_coll = db[a.coll or f"ledger_{a.name}"]
    counters = db[f"counters_{a.name}"]

    lock = threading.Lock()
    ledger = open(a.ledger, "a", buffering=1)
    stats = collections.Counter()
    err_classes = collections.Counter()
    recent = collections.deque(maxlen=256)

    def record(line, key, err=None):
        with lock:
            ledger.write(line)
            stats[key] += 1
            if err is not None:
                err_classes[err] += 1

    def writer(w):
        seq = 0
        period = 1.0 / a.rate if a.rate > 0 else 0.0
        while not STOP.is_set():
            seq += 1
            _id = f"{a.name}-{os.getpid()}-{w}-{seq}"
            t_send = time.time()
            try:
                ledger_coll.insert_one({"_id": _id, "w": w, "seq": seq, "pad": "x" * random.randint(16, 512)})
                record(f"ack\t{_id}\t{t_send:.6f}\t{time.time():.6f}\t\n", "ack")
                recent.append(_id)
            except DuplicateKeyError:
                record(f"dup\t{_id}\t{t_send:.6f}\t{time.time():.6f}\t11000\n", "dup", "DuplicateKeyError")
            except PyMongoError as e:
                cls = type(e).__name__
                code = getattr(e, "code", None)
                if code is not None:
                    cls += f"({code})"
                record(f"err\t{_id}\t{t_send:.6f}\t{time.time():.6f}\t{cls}\n", "err", cls)
            if seq % 5 == 0:
                try:
                    counters.update_one({"_id": w}, {"$inc": {"n": 1}}, upsert=True)
                    if recent:
                        ledger_coll.find_one({"_id": recent[-1]})
                    list(ledger_coll.aggregate([{"$match": {"w": w}}, {"$limit": 5}]))
                    with lock:
                        stats["mixed_ok"] += 1
                except PyMongoError as e:
                    with lock:
                        stats["mixed_err"] += 1
                        err_classes["mixed:" + type(e).__name__] += 1
            if period:
                STOP.wait(period)

    def reader(r):
        while not STOP.is_set():
            try:
                list(ledger_coll.find({"w": r % max(a.writers, 1)}).limit(10))
                ledger_coll.count_documents({"w": r % max(a.writers, 1)}, limit=100)
                with lock:
                    stats["read_ok"] += 1
            except PyMongoError as e:
                with lock:
                    stats["read_err"] += 1
                    err_classes["read:" + type(e).__name__] += 1
                STOP.wait(0.2)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(a.writers)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(a.readers)]
    for t in threads:
        t.start()
    start = time.time()
    while not STOP.wait(a.progress):
        with lock:
            print(json.dumps({"t": round(time.time(), 3), "elapsed": round(time.time() - start, 1),
                              **stats, "errors": dict(err_classes)}), flush=True)
    for t in threads:
        t.join()
    with lock:
        ledger.flush()
        os.fsync(ledger.fileno())
        ledger.close()
        print(json.dumps({"t": round(time.time(), 3), "elapsed": round(time.time() - start, 1),
                          "final": True, **stats, "errors": dict(err_classes)}), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
