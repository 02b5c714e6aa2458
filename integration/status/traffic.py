"""Traffic for the live status-page test: pymongo clients with two application names doing
allowed reads and writes and, now and then, a command the standard policy blocks (W003:
delete_many({})) or warns about, until killed or for --seconds.

  python traffic.py --uri mongodb://user:pw@127.0.0.1:PORT/?authSource=admin --seconds 60
"""

import argparse
import itertools
import time

from pymongo import MongoClient
from pymongo.errors import OperationFailure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--once", action="store_true", help="one round, then exit")
    args = ap.parse_args()
    clients = {
        app: MongoClient(args.uri, appname=app, serverSelectionTimeoutMS=10000)
        for app in ("billing", "reports")
    }
    deadline = time.monotonic() + args.seconds
    blocked = 0
    for i in itertools.count():
        for app, c in clients.items():
            coll = c.shop[f"orders_{app}"]
            coll.insert_one({"i": i, "app": app, "status": "new"})
            coll.find_one({"i": i})
            list(coll.find({"status": "new", "i": {"$gte": i - 10}}).limit(5))
            coll.count_documents({"app": app})
            if i % 3 == 0:
                try:
                    coll.delete_many({})
                except OperationFailure as e:
                    assert e.code == 65001, e
                    blocked += 1
        if args.once or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # pacing of the generated traffic, not a synchronisation
    print(f"traffic: {i + 1} rounds, {blocked} blocked", flush=True)


if __name__ == "__main__":
    main()
