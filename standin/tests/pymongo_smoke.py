#!/usr/bin/env python3
"""Smoke test of the mongoguard stand-in with pymongo 4.x (not run by cargo).

    cargo build -p mongoguard-standin
    pip install pymongo            # optional: python-snappy for snappy
    python3 standin/tests/pymongo_smoke.py [path/to/mongoguard-standin]

Starts the stand-in binary with a user, then checks: SCRAM-SHA-256 / SCRAM-SHA-1 / default
mechanism negotiation, a wrong password, CRUD, getMore, an EXHAUST cursor (exhaust getMore),
a w:0 write (moreToCome) read back, aggregate, zlib (and snappy if available) compression.
"""
import os
import subprocess
import sys

from pymongo import MongoClient, WriteConcern
from pymongo.cursor import CursorType
from pymongo.errors import OperationFailure

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.join(HERE, "..", "..", "target", "debug", "mongoguard-standin")


def crud(client, label):
    db = client.smoke
    coll = db[label]
    coll.drop()
    res = coll.insert_many([{"i": i, "g": i % 3} for i in range(1000)])
    assert len(res.inserted_ids) == 1000
    assert coll.count_documents({}) == 1000
    assert len(list(coll.find({}, batch_size=100))) == 1000
    exhaust = list(coll.find({}, batch_size=100, cursor_type=CursorType.EXHAUST))
    assert len(exhaust) == 1000, len(exhaust)
    assert coll.update_one({"i": 5}, {"$set": {"x": 1}}).modified_count == 1
    assert coll.update_many({"g": 1}, {"$inc": {"x": 1}}).modified_count == 333
    assert coll.update_one({"i": -1}, {"$set": {"x": 1}}, upsert=True).upserted_id is not None
    assert coll.delete_one({"g": 2}).deleted_count == 1
    assert coll.delete_many({"g": 2}).deleted_count == 332
    groups = list(coll.aggregate([{"$match": {"g": {"$ne": None}}},
                                  {"$group": {"_id": "$g", "n": {"$sum": 1}}},
                                  {"$sort": {"_id": 1}}]))
    assert groups == [{"_id": 0, "n": 334}, {"_id": 1, "n": 333}], groups
    doc = coll.find_one_and_update({"i": 7}, {"$set": {"y": 2}}, return_document=True)
    assert doc["y"] == 2
    w0 = coll.with_options(write_concern=WriteConcern(w=0))
    w0.insert_one({"_id": "w0", "v": 1})
    # Same pooled connection (maxPoolSize=1): the unacknowledged write is applied first.
    assert coll.find_one({"_id": "w0"}) == {"_id": "w0", "v": 1}
    print(f"ok  {label}")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_BIN
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--user", "alice:s3cret"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().strip()
        prefix = "mongoguard-standin listening on "
        assert line.startswith(prefix), line
        host = line[len(prefix):]
        base = f"mongodb://alice:s3cret@{host}/?maxPoolSize=1&serverSelectionTimeoutMS=3000"
        crud(MongoClient(base), "default_mech")
        crud(MongoClient(base + "&authMechanism=SCRAM-SHA-256"), "sha256")
        crud(MongoClient(base + "&authMechanism=SCRAM-SHA-1"), "sha1")
        crud(MongoClient(base + "&compressors=zlib"), "zlib")
        try:
            import snappy  # noqa: F401
            crud(MongoClient(base + "&compressors=snappy"), "snappy")
        except ImportError:
            print("skip snappy (pip install python-snappy)")
        try:
            MongoClient(f"mongodb://alice:wrong@{host}/?serverSelectionTimeoutMS=3000").smoke.c.find_one()
            raise AssertionError("wrong password accepted")
        except OperationFailure as e:
            assert e.code == 18, e
            print("ok  wrong password rejected (code 18)")
        try:
            MongoClient(f"mongodb://{host}/?serverSelectionTimeoutMS=3000").smoke.c.find_one()
            raise AssertionError("unauthenticated find accepted")
        except OperationFailure as e:
            assert e.code == 13, e
            print("ok  unauthenticated command rejected (code 13)")
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    assert proc.returncode == 0, proc.returncode
    print("all pymongo checks passed")


if __name__ == "__main__":
    main()
