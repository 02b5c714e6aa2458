#!/usr/bin/env python3
"""Memory of a mongoguard process under idle clients and under a burst of large inserts.

Two subcommands (the legacy form `idle_clients.py N PORT SECONDS` still works: it only opens N
connections, completes a hello on each, prints "open N" and holds them for SECONDS):

  idle_clients.py idle  --port P --pid PID -n N [--hold S] [--after S] [--json]
                        [--user U --password PW [--auth-db admin]]
      RSS of PID (VmRSS from /proc/PID/status) before; then N connections, each with a hello
      answered; RSS once all are open and idle for --hold seconds; then all close, and RSS
      --after seconds later. Also the process's open descriptors (/proc/PID/fd) while idle
      and after close, to tell memory the allocator keeps from sessions still open.
      With --user, every connection authenticates with SCRAM-SHA-256 as drivers do (hello
      carrying speculativeAuthenticate, then saslContinue; skipEmptyExchange), so an idle
      client is an authenticated one (pooled mode without allow_unauthenticated).
  idle_clients.py burst --port P --pid PID -c C [--mb 4] [--rounds 1] [--after S] [--json]
      C concurrent connections each send one insert of a --mb MiB document (OP_MSG, kind-1
      document sequence), read the reply and close; --rounds times. Reports the peak RSS seen
      (sampled every 50 ms) and the RSS --after seconds after the last client left.

Only the standard library and `bson` (from pymongo, integration/.venv) are used. The script
raises its own RLIMIT_NOFILE to its hard limit; the proxy needs `ulimit -n` raised by whoever
starts it (passthrough holds two sockets per client).

Example: integration/.venv/bin/python bench/idle_clients.py idle --port 27101 --pid 1234 -n 5000
"""
import argparse
import base64
import hashlib
import hmac
import json
import os
import resource
import socket
import struct
import sys
import threading
import time

import bson

OP_MSG = 2013


def op_msg(request_id, body, seq=None):
    """An OP_MSG with a kind-0 body and optionally one kind-1 sequence (identifier, docs)."""
    payload = struct.pack("<I", 0) + b"\x00" + bson.encode(body)
    if seq is not None:
        ident, docs = seq
        inner = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        payload += b"\x01" + struct.pack("<i", 4 + len(inner)) + inner
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, OP_MSG) + payload


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the server")
        buf += chunk
    return bytes(buf)


def read_reply(s):
    """The reply body of an OP_MSG (kind-0 section) as a dict."""
    hdr = recv_exact(s, 16)
    length, _, _, opcode = struct.unpack("<iiii", hdr)
    rest = recv_exact(s, length - 16)
    if opcode != OP_MSG or rest[4] != 0:
        raise ValueError(f"unexpected reply opcode {opcode}")
    return bson.decode(rest[5:])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Scram:
    """SCRAM-SHA-256 client (RFC 5802 / 7677) for an ASCII user and password (no SASLprep
    needed). Caches the salted password per (salt, iterations), as drivers do."""

    def __init__(self, user, password, db):
        self.user = user.replace("=", "=3D").replace(",", "=2C")
        self.password = password.encode()
        self.db = db
        self.cache = {}

    def start(self):
        """(client-first message, state for finish)."""
        nonce = base64.b64encode(os.urandom(24)).decode()
        bare = f"n={self.user},r={nonce}"
        return ("n,," + bare).encode(), (bare, nonce)

    def finish(self, state, server_first):
        """(client-final message, expected server signature)."""
        bare, nonce = state
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        if not attrs["r"].startswith(nonce):
            raise RuntimeError("server nonce does not extend ours")
        salt, iters = base64.b64decode(attrs["s"]), int(attrs["i"])
        key = (salt, iters)
        if key not in self.cache:
            self.cache[key] = hashlib.pbkdf2_hmac("sha256", self.password, salt, iters)
        salted = self.cache[key]
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        expected = hmac.new(server_key, auth_message, hashlib.sha256).digest()
        final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
        return final, expected


def request(s, rid, body):
    s.sendall(op_msg(rid, body))
    reply = read_reply(s)
    if reply.get("ok") != 1:
        raise RuntimeError(f"{next(iter(body))} failed: {reply}")
    return reply


def authenticate(s, scram):
    """hello with speculativeAuthenticate (saslStart if the server declines it), then
    saslContinue (and the empty one if the server is not done); checks the server's proof."""
    first, state = scram.start()
    start = {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bson.Binary(first),
             "options": {"skipEmptyExchange": True}}
    hello = {"hello": 1, "helloOk": True,
             "client": {"driver": {"name": "idle_clients.py", "version": "1"},
                        "os": {"type": "Linux"}},
             "speculativeAuthenticate": dict(start, db=scram.db), "$db": "admin"}
    reply = request(s, 1, hello).get("speculativeAuthenticate")
    if reply is None:
        reply = request(s, 2, dict(start, **{"$db": scram.db}))
    final, expected = scram.finish(state, bytes(reply["payload"]))
    cid = reply["conversationId"]
    reply = request(s, 3, {"saslContinue": 1, "conversationId": cid,
                           "payload": bson.Binary(final), "$db": scram.db})
    got = dict(a.split("=", 1) for a in bytes(reply["payload"]).decode().split(","))
    if base64.b64decode(got.get("v", "")) != expected:
        raise RuntimeError("server signature does not verify")
    if not reply.get("done"):
        reply = request(s, 4, {"saslContinue": 1, "conversationId": cid,
                               "payload": bson.Binary(b""), "$db": scram.db})
        if not reply.get("done"):
            raise RuntimeError("SASL conversation not done after the empty exchange")


def open_idle(port, n, scram=None):
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        if scram is None:
            s.sendall(op_msg(i + 1, {"hello": 1, "$db": "admin"}))
            reply = read_reply(s)
            if reply.get("ok") != 1:
                raise RuntimeError(f"hello {i} failed: {reply}")
        else:
            try:
                authenticate(s, scram)
            except Exception as e:
                raise RuntimeError(f"client {i}: {e}") from e
        socks.append(s)
    return socks


def cmd_idle(a):
    hard = raise_nofile()
    if a.n + 64 > hard:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is below {a.n} sockets: raise ulimit -n")
    scram = Scram(a.user, a.password, a.auth_db) if a.user else None
    before = rss_kib(a.pid)
    t0 = time.monotonic()
    socks = open_idle(a.port, a.n, scram)
    opened_s = time.monotonic() - t0
    time.sleep(a.hold)
    held = rss_kib(a.pid)
    fds_idle = fd_count(a.pid)
    for s in socks:
        s.close()
    time.sleep(a.after)
    after = rss_kib(a.pid)
    fds_after = fd_count(a.pid)
    out = {
        "clients": a.n,
        "authenticated": scram is not None,
        "rss_before_kib": before,
        "rss_idle_kib": held,
        "per_client_kib": round((held - before) / a.n, 2),
        "rss_after_close_kib": after,
        "after_s": a.after,
        "open_seconds": round(opened_s, 2),
        "fds_idle": fds_idle,
        "fds_after_close": fds_after,
    }
    report(a, out)


def cmd_burst(a):
    raise_nofile()
    size = a.mb * 1024 * 1024
    doc_pad = b"x" * (size - 64)
    errors = []
    peak = [rss_kib(a.pid)]
    before = peak[0]
    done = threading.Event()

    def sampler():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], rss_kib(a.pid))
            except OSError:
                return
            time.sleep(0.05)

    seq_lock = threading.Lock()
    next_id = [0]

    def client():
        with seq_lock:
            next_id[0] += 1
            my = next_id[0]
        try:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=60)
            s.sendall(op_msg(1, {"hello": 1, "$db": "admin"}))
            read_reply(s)
            doc = {"_id": f"burst-{os.getpid()}-{my}", "pad": bson.Binary(doc_pad)}
            s.sendall(op_msg(2, {"insert": a.coll, "$db": a.db}, ("documents", [doc])))
            reply = read_reply(s)
            if reply.get("ok") != 1 or reply.get("writeErrors"):
                errors.append(str(reply)[:200])
            s.close()
        except Exception as e:  # noqa: BLE001 - every failure is reported, none aborts the burst
            errors.append(repr(e)[:200])

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.monotonic()
    for _ in range(a.rounds):
        threads = [threading.Thread(target=client) for _ in range(a.c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - t0
    done.set()
    th.join()
    time.sleep(a.after)
    out = {
        "clients": a.c,
        "rounds": a.rounds,
        "mib_per_insert": a.mb,
        "seconds": round(elapsed, 2),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "rss_before_kib": before,
        "rss_peak_kib": peak[0],
        "rss_after_kib": rss_kib(a.pid),
        "after_s": a.after,
    }
    report(a, out)
    if errors:
        sys.exit(1)


def report(a, out):
    if a.json:
        print(json.dumps(out), flush=True)
    else:
        for k, v in out.items():
            print(f"{k}: {v}", flush=True)


def legacy(argv):
    n, port, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    raise_nofile()
    socks = open_idle(port, n)
    print("open", len(socks), flush=True)
    time.sleep(seconds)


def main():
    if len(sys.argv) == 4 and sys.argv[1].isdigit():
        legacy(sys.argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("idle", help="RSS with N idle clients and after they leave")
    i.add_argument("-n", type=int, required=True)
    i.add_argument("--hold", type=float, default=3.0)
    i.add_argument("--user", help="authenticate every client (SCRAM-SHA-256) as this user")
    i.add_argument("--password")
    i.add_argument("--auth-db", default="admin")
    b = sub.add_parser("burst", help="RSS during and after C clients sending one large insert")
    b.add_argument("-c", type=int, default=64)
    b.add_argument("--mb", type=int, default=4)
    b.add_argument("--rounds", type=int, default=1)
    b.add_argument("--db", default="membench")
    b.add_argument("--coll", default="burst")
    for q in (i, b):
        q.add_argument("--port", type=int, required=True)
        q.add_argument("--pid", type=int, required=True, help="the mongoguard process to sample")
        q.add_argument("--after", type=float, default=5.0, help="seconds to wait after close")
        q.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.cmd == "idle" and bool(a.user) != bool(a.password):
        p.error("--user and --password go together")
    {"idle": cmd_idle, "burst": cmd_burst}[a.cmd](a)


if __name__ == "__main__":
    main()
