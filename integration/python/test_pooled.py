"""pymongo through mongoguard in pooled mode (run by integration/run_pooled.sh).

In pooled mode clients authenticate to mongoguard (SCRAM, users file) and their commands run on
a small pool of upstream connections that mongoguard authenticated itself, as the upstream
identity. mongoguard answers hello itself, as a mongos ("isdbgrid").

Environment (set by integration/run_pooled.sh; without MONGOGUARD_POOLED_ADDR the module is
skipped, so `run_local.sh`, which collects the whole directory, is unaffected):
  MONGOGUARD_POOLED_ADDR      host:port of mongoguard in pooled mode
  MONGOGUARD_POOLED_USER      a user of mongoguard's users file (auth db admin)
  MONGOGUARD_POOLED_PASSWORD  its password
  MONGOGUARD_STANDIN_ADDR     host:port of the mongoguard-standin behind it ({standinStats: 1})
  MONGOGUARD_STANDIN_URI      mongodb:// URI of the stand-in with the upstream credentials
  MONGOGUARD_POOL_SIZE        mongoguard's [pool] pool_size
  MONGOGUARD_POOLED_ADMIN     host:port of its admin listener, when the pool is sharded (two
                              session threads or more): slots moved between the shards close
                              and open upstream connections, and the churn test allows one
                              more connection and authentication per slot moved (its /metrics)

Every test name contains "pooled". Nothing asserts on wall-clock durations: waits are bounded
polls with generous limits.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote_plus

import bson
import pytest
from pymongo import MongoClient, monitoring
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

if not os.environ.get("MONGOGUARD_POOLED_ADDR"):
    pytest.skip(
        "pooled-mode suite: MONGOGUARD_POOLED_ADDR is not set (run integration/run_pooled.sh)",
        allow_module_level=True,
    )

ADDR = os.environ["MONGOGUARD_POOLED_ADDR"]
USER = os.environ.get("MONGOGUARD_POOLED_USER", "")
PASSWORD = os.environ.get("MONGOGUARD_POOLED_PASSWORD", "")
STANDIN_ADDR = os.environ.get("MONGOGUARD_STANDIN_ADDR", "")
STANDIN_URI = os.environ.get("MONGOGUARD_STANDIN_URI", "")
POOL_SIZE = int(os.environ.get("MONGOGUARD_POOL_SIZE", "4"))
ADMIN_ADDR = os.environ.get("MONGOGUARD_POOLED_ADMIN", "")

BLOCK_CODE = 65001
BLOCK_CODE_NAME = "MongoguardPolicyViolation"
AUTH_FAILED = 18
UNAUTHORIZED = 13

SERVERLESS_CLIENTS = 2000
SERVERLESS_CONCURRENCY = 100
POLL_ATTEMPTS = 300
POLL_PAUSE = 0.1  # seconds between polls; never asserted on

OP_MSG = 2013

# Generous client timeouts: a debug build under 100 concurrent handshakes can be slow.
CLIENT_OPTS: dict[str, object] = {
    "serverSelectionTimeoutMS": 60000,
    "connectTimeoutMS": 30000,
    "socketTimeoutMS": 120000,
    "waitQueueTimeoutMS": 120000,
}


# --------------------------------------------------------------------------------------------
# Clients, the stand-in's counters, databases
# --------------------------------------------------------------------------------------------


def proxy_uri(user: str | None = USER, password: str | None = PASSWORD, **query: object) -> str:
    """mongodb:// URI of mongoguard; with credentials unless `user` is None."""
    cred = ""
    if user is not None:
        cred = f"{quote_plus(user)}:{quote_plus(password or '')}@"
    opts = {"authSource": "admin"} if user is not None else {}
    opts.update({k: str(v) for k, v in query.items()})
    qs = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"mongodb://{cred}{ADDR}/" + (f"?{qs}" if qs else "")


def proxy_client(user: str | None = USER, password: str | None = PASSWORD, **kw) -> MongoClient:
    opts = dict(CLIENT_OPTS)
    opts.update(kw)
    return MongoClient(proxy_uri(user, password), **opts)


def direct_client() -> MongoClient:
    if not STANDIN_URI:
        pytest.fail("MONGOGUARD_STANDIN_URI is not set")
    return MongoClient(STANDIN_URI, directConnection=True, **CLIENT_OPTS)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        buf += chunk
    return bytes(buf)


def standin_stats(reset: bool = False) -> dict:
    """{standinStats: 1} on one fresh raw connection (no hello, no auth; it counts as one
    accepted connection)."""
    if not STANDIN_ADDR:
        pytest.fail("MONGOGUARD_STANDIN_ADDR is not set")
    host, _, port = STANDIN_ADDR.rpartition(":")
    cmd: dict = {"standinStats": 1, "$db": "admin"}
    if reset:
        cmd["reset"] = True
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        body = struct.pack("<I", 0) + b"\x00" + bson.encode(cmd)
        sock.sendall(struct.pack("<iiii", 16 + len(body), 7, 0, OP_MSG) + body)
        length, _rid, _to, opcode = struct.unpack("<iiii", _recv_exact(sock, 16))
        payload = _recv_exact(sock, length - 16)
    assert opcode == OP_MSG and payload[4] == 0, f"unexpected reply opcode {opcode}"
    reply = bson.decode(payload[5:])
    assert reply.get("ok") == 1, f"standinStats failed: {reply}"
    return reply


def upstream_delta(before: dict, after: dict) -> tuple[int, int]:
    """(connections accepted, authentications) between two standin_stats() calls, not
    counting the connection the second call itself opened."""
    conns = after["connectionsAccepted"] - before["connectionsAccepted"] - 1
    auths = after["authentications"] - before["authentications"]
    return conns, auths


def slots_moved() -> int:
    """mongoguard_pool_slots_moved_total from the admin listener's /metrics (0 without one:
    an unsharded pool moves no slots)."""
    if not ADMIN_ADDR:
        return 0
    with urllib.request.urlopen(f"http://{ADMIN_ADDR}/metrics", timeout=30) as r:
        text = r.read().decode()
    name = "mongoguard_pool_slots_moved_total"
    return int(sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith((name + " ", name + "{"))))


@pytest.fixture()
def client():
    c = proxy_client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def direct():
    c = direct_client()
    yield c
    c.close()


@pytest.fixture()
def db(direct):
    name = f"mgt_pooled_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield name
    try:
        direct.drop_database(name)
    except Exception:  # noqa: BLE001 - best-effort cleanup
        pass


class Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.names: list[str] = []

    def started(self, event) -> None:
        with self.lock:
            self.names.append(event.command_name)

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass

    def count(self, name: str) -> int:
        with self.lock:
            return sum(1 for n in self.names if n == name)


class Pool(monitoring.ConnectionPoolListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created = 0
        self.closed = 0
        self.cleared = 0

    def pool_created(self, event) -> None:
        pass

    def pool_ready(self, event) -> None:
        pass

    def pool_cleared(self, event) -> None:
        with self.lock:
            self.cleared += 1

    def pool_closed(self, event) -> None:
        pass

    def connection_created(self, event) -> None:
        with self.lock:
            self.created += 1

    def connection_ready(self, event) -> None:
        pass

    def connection_closed(self, event) -> None:
        with self.lock:
            self.closed += 1

    def connection_check_out_started(self, event) -> None:
        pass

    def connection_check_out_failed(self, event) -> None:
        pass

    def connection_checked_out(self, event) -> None:
        pass

    def connection_checked_in(self, event) -> None:
        pass


def poll(predicate, what: str):
    last = None
    for _ in range(POLL_ATTEMPTS):
        last = predicate()
        if last:
            return last
        time.sleep(POLL_PAUSE)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})")


# --------------------------------------------------------------------------------------------
# hello and authentication
# --------------------------------------------------------------------------------------------


def test_pooled_hello_is_mongos(client):
    hello = client.admin.command("hello")
    assert hello.get("msg") == "isdbgrid", hello
    assert "hosts" not in hello, hello
    assert "setName" not in hello, hello
    assert hello.get("isWritablePrimary") is True, hello
    assert hello.get("maxWireVersion", 0) >= 8, hello  # transactions on a mongos need >= 8


def test_pooled_hello_without_credentials():
    with proxy_client(user=None) as c:
        hello = c.admin.command("hello")
    assert hello.get("msg") == "isdbgrid", hello


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_pooled_scram_mechanisms(mechanism, db):
    with proxy_client(authMechanism=mechanism) as c:
        c[db]["c"].insert_one({"_id": mechanism})
        assert c[db]["c"].find_one({"_id": mechanism}) == {"_id": mechanism}


def test_pooled_wrong_password_is_auth_failed():
    with proxy_client(password=PASSWORD + "-wrong") as c:
        with pytest.raises(OperationFailure) as info:
            c.admin.command("ping")
    assert info.value.code == AUTH_FAILED, info.value.details


def test_pooled_unknown_user_is_auth_failed():
    with proxy_client(user="nobody-" + uuid.uuid4().hex[:6], password="x") as c:
        with pytest.raises(OperationFailure) as info:
            c.admin.command("ping")
    assert info.value.code == AUTH_FAILED, info.value.details


def test_pooled_unauthenticated_command_is_unauthorized(db):
    pool = Pool()
    with proxy_client(user=None, maxPoolSize=1, event_listeners=[pool]) as c:
        with pytest.raises(OperationFailure) as info:
            c[db]["c"].find_one({})
        assert info.value.code == UNAUTHORIZED, info.value.details
        # The same (only) pooled connection still answers hello.
        hello = c.admin.command("hello")
        assert hello.get("msg") == "isdbgrid", hello
        assert pool.created == 1 and pool.closed == 0 and pool.cleared == 0, vars(pool)


# --------------------------------------------------------------------------------------------
# Serverless-style churn: many short-lived clients, few upstream connections
# --------------------------------------------------------------------------------------------


def test_pooled_serverless_churn_is_bounded_by_pool_size(db, direct):
    uri = proxy_uri()
    coll_name = "churn"

    def one(i: int) -> None:
        with MongoClient(uri, maxPoolSize=1, **CLIENT_OPTS) as c:
            c[db][coll_name].insert_one({"_id": i})

    before = standin_stats()
    moved_before = slots_moved()
    errors: list[str] = []
    with ThreadPoolExecutor(SERVERLESS_CONCURRENCY) as pool:
        futures = [pool.submit(one, i) for i in range(SERVERLESS_CLIENTS)]
        for f in futures:
            exc = f.exception()
            if exc is not None:
                errors.append(repr(exc))
    after = standin_stats()
    moved = slots_moved() - moved_before
    conns, auths = upstream_delta(before, after)
    print(
        f"serverless churn: {SERVERLESS_CLIENTS} clients ({SERVERLESS_CONCURRENCY} at a time), "
        f"{len(errors)} errors; upstream connections accepted {conns}, authentications {auths}, "
        f"inserts {after['commands'].get('insert', 0) - before['commands'].get('insert', 0)}, "
        f"pool slots moved between shards {moved}"
    )
    assert not errors, f"{len(errors)} clients failed, e.g. {errors[:3]}"
    # A slot moved between two shards of a sharded pool closes at most one connection and
    # opens at most one (the shards' limits still add up to pool_size).
    bound = POOL_SIZE + moved
    assert conns <= bound, f"{conns} upstream connections > pool_size {POOL_SIZE} + {moved} moved"
    assert auths <= bound, (
        f"{auths} upstream authentications > pool_size {POOL_SIZE} + {moved} moved"
    )
    ids = {d["_id"] for d in direct[db][coll_name].find({}, {"_id": 1})}
    assert ids == set(range(SERVERLESS_CLIENTS)), f"{len(ids)} documents stored"


# --------------------------------------------------------------------------------------------
# Cursors, unacknowledged writes, transactions
# --------------------------------------------------------------------------------------------


def test_pooled_cursor_crosses_batches(db):
    cmds = Commands()
    with proxy_client(event_listeners=[cmds]) as c:
        coll = c[db]["docs"]
        coll.insert_many([{"_id": i, "v": i * 2} for i in range(1000)])
        seen = {}
        for d in coll.find({}).batch_size(100):
            seen[d["_id"]] = d["v"]
    assert seen == {i: i * 2 for i in range(1000)}
    assert cmds.count("getMore") >= 9, cmds.names


def test_pooled_more_open_cursors_than_pool(db):
    """3 x pool_size cursors open at once, their getMores interleaved: a cursor must not need
    an upstream connection of its own between batches."""
    n_cursors = 3 * POOL_SIZE
    n_docs = 500
    with proxy_client() as c:
        c[db]["docs"].insert_many([{"_id": i} for i in range(n_docs)])
        barrier = threading.Barrier(n_cursors, timeout=120)

        def read(_k: int) -> int:
            cur = c[db]["docs"].find({}).batch_size(50)
            first = next(cur)
            barrier.wait()  # every cursor is open now
            return 1 + sum(1 for _ in cur) if first is not None else 0

        with ThreadPoolExecutor(n_cursors) as pool:
            counts = list(pool.map(read, range(n_cursors)))
    assert counts == [n_docs] * n_cursors


def test_pooled_unacknowledged_writes_then_read_back(client, db):
    coll = client[db]["w0"]
    w0 = coll.with_options(write_concern=WriteConcern(w=0))
    for i in range(50):
        r = w0.insert_one({"_id": i})
        assert not r.acknowledged
    poll(lambda: coll.count_documents({}) == 50, "50 unacknowledged inserts to be readable")
    assert sorted(d["_id"] for d in coll.find({})) == list(range(50))


def test_pooled_transaction_completes(client, db):
    coll = client[db]["txn"]
    coll.insert_one({"_id": "before"})  # the collection exists before the transaction
    with client.start_session() as s:
        with s.start_transaction():
            coll.insert_one({"_id": "a"}, session=s)
            coll.insert_one({"_id": "b"}, session=s)
            assert coll.find_one({"_id": "a"}, session=s) is not None
    ids = {d["_id"] for d in coll.find({})}
    assert {"before", "a", "b"} <= ids, ids
    # An aborted transaction also completes (the stand-in has no transaction semantics, so
    # only completion is checked).
    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": "c"}, session=s)
        s.abort_transaction()
    # And the client still works.
    assert coll.find_one({"_id": "before"}) is not None


class Succeeded(monitoring.CommandListener):
    """Names of the commands that succeeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.names: list[str] = []

    def started(self, event) -> None:
        pass

    def succeeded(self, event) -> None:
        with self.lock:
            self.names.append(event.command_name)

    def failed(self, event) -> None:
        pass


def test_pooled_end_sessions_on_close_is_answered_and_reaches_the_upstream(db):
    """pymongo ends its sessions in close() and waits for the reply: mongoguard answers a plain
    endSessions itself and ends the sessions upstream in the background (one upstream round
    trip less per short-lived client). The reply succeeds, and the upstream still gets it."""
    before = standin_stats()
    done = Succeeded()
    c = proxy_client(event_listeners=[done])
    with c.start_session() as s:
        c[db]["ended"].insert_one({"x": 1}, session=s)
    c.close()
    assert "endSessions" in done.names, done.names
    poll(
        lambda: standin_stats()["commands"].get("endsessions", 0)
        > before["commands"].get("endsessions", 0),
        "the upstream to receive endSessions",
    )


# --------------------------------------------------------------------------------------------
# The guard, in pooled mode
# --------------------------------------------------------------------------------------------


def test_pooled_blocked_command_then_client_still_works(db, direct):
    cmds = Commands()
    with proxy_client(event_listeners=[cmds]) as c:
        coll = c[db]["g"]
        coll.insert_many([{"_id": i} for i in range(3)])
        with pytest.raises(OperationFailure) as info:
            coll.delete_many({})
        exc = info.value
        details = exc.details or {}
        assert exc.code == BLOCK_CODE, details
        assert details.get("codeName") == BLOCK_CODE_NAME, details
        assert "W003" in details.get("errmsg", ""), details
        assert cmds.count("delete") == 1, "pymongo retried the blocked delete"
        # The same client keeps working.
        assert coll.count_documents({}) == 3
        coll.insert_one({"_id": 3})
    assert direct[db]["g"].count_documents({}) == 4
