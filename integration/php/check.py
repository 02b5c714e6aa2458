"""Helpers for integration/run_pooled.sh (run with the integration venv's python: needs pymongo).

  check.py stats HOST:PORT [--reset]
      Asks the stand-in for {standinStats: 1} on ONE fresh raw TCP connection (no hello, no
      auth), prints the reply as JSON. That connection itself counts 1 in connectionsAccepted.
      With --reset the counters are zeroed after reading.

  check.py count URI DB COLL RUN N
      Connects to URI (directConnection) and checks that exactly N documents with run=RUN
      exist, with the _ids RUN-1 .. RUN-N. Exits 1 otherwise.
"""

from __future__ import annotations

import json
import socket
import struct
import sys

import bson

OP_MSG = 2013


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        buf += chunk
    return bytes(buf)


def raw_command(addr: str, doc: dict, timeout: float = 30.0) -> dict:
    """Sends one OP_MSG command on a new connection and returns the reply document."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        body = struct.pack("<I", 0) + b"\x00" + bson.encode(doc)
        sock.sendall(struct.pack("<iiii", 16 + len(body), 1, 0, OP_MSG) + body)
        length, _rid, _to, opcode = struct.unpack("<iiii", _recv_exact(sock, 16))
        payload = _recv_exact(sock, length - 16)
        if opcode != OP_MSG or payload[4] != 0:
            raise ValueError(f"unexpected reply opcode {opcode}")
        return bson.decode(payload[5:])


def standin_stats(addr: str, reset: bool = False) -> dict:
    cmd: dict = {"standinStats": 1, "$db": "admin"}
    if reset:
        cmd["reset"] = True
    reply = raw_command(addr, cmd)
    if reply.get("ok") != 1:
        raise RuntimeError(f"standinStats failed (is it implemented in this stand-in?): {reply}")
    return reply


def _count(uri: str, db: str, coll: str, run: str, n: int) -> int:
    from pymongo import MongoClient

    with MongoClient(uri, directConnection=True, serverSelectionTimeoutMS=30000) as client:
        ids = {d["_id"] for d in client[db][coll].find({"run": run}, {"_id": 1})}
    want = {f"{run}-{i}" for i in range(1, n + 1)}
    missing, extra = want - ids, ids - want
    print(json.dumps({"run": run, "found": len(ids), "expected": n, "missing": len(missing),
                      "unexpected": len(extra), "missing_sample": sorted(missing)[:5]}))
    return 0 if not missing and not extra else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "stats":
        print(json.dumps(standin_stats(argv[1], reset="--reset" in argv[2:]), default=str))
        return 0
    if len(argv) == 6 and argv[0] == "count":
        return _count(argv[1], argv[2], argv[3], argv[4], int(argv[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
