"""pymongo through mongoguard.

Environment:
  MONGOGUARD_PROXY_URI   mongodb:// URI of the mongoguard proxy under test
  MONGOGUARD_DIRECT_URI  mongodb:// URI of the upstream the proxy fronts (a mongod or the
                         mongoguard-standin), used to verify what really reached it

Every test works in its own database (dropped afterwards through the direct URI), so the suite
can run against a shared real mongod. Nothing asserts on wall-clock durations: waits are bounded
polls. See integration/README.md.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import bson
import pytest
from bson.int64 import Int64
from pymongo import MongoClient, monitoring
from pymongo.cursor import CursorType
from pymongo.errors import InvalidOperation
from pymongo.write_concern import WriteConcern

N = 1000
BATCH = 100
COMPRESSORS = ["zlib", "snappy", "zstd"]
POLL_ATTEMPTS = 100
POLL_PAUSE = 0.1  # seconds between polls; never asserted on

OP_COMPRESSED = 2012
OP_MSG = 2013
CHECKSUM_PRESENT = 1
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
COMPRESSOR_IDS = {"snappy": 1, "zlib": 2, "zstd": 3}


# --------------------------------------------------------------------------------------------
# URIs, clients, databases
# --------------------------------------------------------------------------------------------


def with_options(uri: str, **opts: object) -> str:
    """`uri` with query options added (existing ones with the same name are replaced)."""
    parts = urlsplit(uri)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in opts]
    for k, v in opts.items():
        query.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


@pytest.fixture(scope="session")
def proxy_uri() -> str:
    uri = os.environ.get("MONGOGUARD_PROXY_URI")
    if not uri:
        pytest.fail("MONGOGUARD_PROXY_URI is not set (integration/run_local.sh sets it)")
    return uri


@pytest.fixture(scope="session")
def direct_uri() -> str:
    uri = os.environ.get("MONGOGUARD_DIRECT_URI")
    if not uri:
        pytest.fail("MONGOGUARD_DIRECT_URI is not set (integration/run_local.sh sets it)")
    return uri


def proxy_client_uri(proxy_uri: str, **opts: object) -> str:
    merged: dict[str, object] = {
        "serverSelectionTimeoutMS": 30000,
        "connectTimeoutMS": 20000,
        "directConnection": True,
    }
    merged.update(opts)
    return with_options(proxy_uri, **merged)


def direct_client_uri(direct_uri: str) -> str:
    opts: dict[str, object] = {"serverSelectionTimeoutMS": 30000}
    if "directconnection=" not in direct_uri.lower():
        # A replica-set member is used on its own: its advertised host names may not resolve
        # from here (docker compose).
        opts["directConnection"] = True
    return with_options(direct_uri, **opts)


@pytest.fixture
def direct(direct_uri: str):
    client = MongoClient(direct_client_uri(direct_uri))
    yield client
    client.close()


@pytest.fixture
def db_name(request, direct_uri: str):
    """A database name unique to this test and run; dropped afterwards through the direct URI."""
    tag = "".join(c if c.isalnum() else "_" for c in request.node.name)[:28]
    name = f"mgt_py_{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield name
    client = MongoClient(direct_client_uri(direct_uri))
    try:
        client.drop_database(name)
    finally:
        client.close()


class CommandLog(monitoring.CommandListener):
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


def poll(check) -> bool:
    """True as soon as `check()` is true, within POLL_ATTEMPTS attempts."""
    for attempt in range(POLL_ATTEMPTS):
        if check():
            return True
        if attempt + 1 < POLL_ATTEMPTS:
            time.sleep(POLL_PAUSE)
    return False


# --------------------------------------------------------------------------------------------
# The CRUD scenario
# --------------------------------------------------------------------------------------------


def original_doc(i: int) -> dict:
    return {
        "_id": i,
        "n": i,
        "group": i % 10,
        "tag": f"doc-{i:04d}",
        "nested": {"sq": i * i, "list": [i, i + 1, i + 2]},
    }


def expected_after_crud() -> list[dict]:
    out = []
    for i in range(N):
        if i % 10 == 7:
            continue
        d = original_doc(i)
        if i == 5:
            d["updated"] = True
        if i % 10 == 3:
            d["flag"] = "g3"
        out.append(d)
    return out


def crud_scenario(client: MongoClient, log: CommandLog, direct: MongoClient, db_name: str):
    coll = client[db_name]["docs"]

    docs = [original_doc(i) for i in range(N)]
    res = coll.insert_many(docs)
    assert len(res.inserted_ids) == N

    get_mores = log.count("getMore")
    found = list(coll.find({}).sort("_id", 1).batch_size(BATCH))
    assert len(found) == N
    assert found == [original_doc(i) for i in range(N)]
    get_mores = log.count("getMore") - get_mores
    assert get_mores >= N // BATCH - 1, f"expected >= 9 getMore batches, saw {get_mores}"

    r = coll.update_one({"_id": 5}, {"$set": {"updated": True}})
    assert (r.matched_count, r.modified_count) == (1, 1)
    r = coll.update_one({"_id": -1}, {"$set": {"updated": True}})
    assert (r.matched_count, r.modified_count, r.upserted_id) == (0, 0, None)
    r = coll.update_many({"group": 3}, {"$set": {"flag": "g3"}})
    assert (r.matched_count, r.modified_count) == (100, 100)
    r = coll.update_many({"group": 3}, {"$set": {"flag": "g3"}})
    assert (r.matched_count, r.modified_count) == (100, 0), "a no-op update modifies nothing"

    assert coll.delete_one({"_id": 7}).deleted_count == 1
    assert coll.delete_many({"group": 7}).deleted_count == 99
    assert coll.delete_one({"_id": 7}).deleted_count == 0
    assert coll.count_documents({}) == 900

    agg = list(
        coll.aggregate(
            [
                {"$match": {"group": {"$in": [1, 2]}}},
                {"$sort": {"n": -1}},
                {"$limit": 5},
                {"$project": {"_id": 0, "n": 1, "group": 1}},
            ]
        )
    )
    assert agg == [{"n": n, "group": n % 10} for n in (992, 991, 982, 981, 972)]

    stored = list(direct[db_name]["docs"].find({}).sort("_id", 1))
    assert len(stored) == 900
    assert stored == expected_after_crud()


# --------------------------------------------------------------------------------------------
# Raw OP_MSG over a socket (exhaust getMore, compressed handshakes)
# --------------------------------------------------------------------------------------------


def _zstd_module():
    for name in ("compression.zstd", "backports.zstd"):
        try:
            return __import__(name, fromlist=["compress"])
        except ImportError:
            pass
    try:
        import zstandard

        return zstandard
    except ImportError:
        return None


def compress(name: str, data: bytes) -> bytes:
    if name == "zlib":
        return zlib.compress(data)
    if name == "snappy":
        import snappy

        return snappy.compress(data)
    if name == "zstd":
        mod = _zstd_module()
        if mod is None:
            pytest.skip("no zstd module installed")
        if mod.__name__ == "zstandard":
            return mod.ZstdCompressor().compress(data)
        return mod.compress(data)
    raise ValueError(name)


def decompress(compressor_id: int, data: bytes, size: int) -> bytes:
    if compressor_id == 0:
        return data
    if compressor_id == 2:
        return zlib.decompress(data)
    if compressor_id == 1:
        import snappy

        return snappy.uncompress(data)
    if compressor_id == 3:
        mod = _zstd_module()
        assert mod is not None, "a zstd reply and no zstd module"
        if mod.__name__ == "zstandard":
            return mod.ZstdDecompressor().decompress(data, max_output_size=size)
        return mod.decompress(data)
    raise AssertionError(f"unknown compressor id {compressor_id}")


class Reply:
    def __init__(self, request_id: int, response_to: int, flags: int, body: dict, compressed_with):
        self.request_id = request_id
        self.response_to = response_to
        self.flags = flags
        self.body = body
        self.compressed_with = compressed_with

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & MORE_TO_COME)


class RawConn:
    """A minimal OP_MSG client; every read is bounded by the socket timeout."""

    def __init__(self, uri: str):
        parts = urlsplit(uri)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 27017
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.next_id = 0
        self.compressor: str | None = None

    def close(self) -> None:
        self.sock.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def send(self, body: dict, flags: int = 0) -> int:
        self.next_id += 1
        rid = self.next_id
        payload = struct.pack("<I", flags) + b"\x00" + bson.encode(body)
        if self.compressor:
            comp = compress(self.compressor, payload)
            inner = struct.pack("<iiB", OP_MSG, len(payload), COMPRESSOR_IDS[self.compressor])
            msg = struct.pack("<iiii", 16 + len(inner) + len(comp), rid, 0, OP_COMPRESSED)
            self.sock.sendall(msg + inner + comp)
        else:
            self.sock.sendall(struct.pack("<iiii", 16 + len(payload), rid, 0, OP_MSG) + payload)
        return rid

    def read(self) -> Reply:
        length, rid, response_to, op = struct.unpack("<iiii", self._recv_exact(16))
        assert 21 <= length <= 48_000_000, f"implausible messageLength {length}"
        data = self._recv_exact(length - 16)
        compressed_with = None
        if op == OP_COMPRESSED:
            op, size, cid = struct.unpack("<iiB", data[:9])
            data = decompress(cid, data[9:], size)
            assert len(data) == size, "uncompressed size differs from the declared one"
            compressed_with = cid
        assert op == OP_MSG, f"expected OP_MSG, got opCode {op}"
        (flags,) = struct.unpack("<I", data[:4])
        end = len(data) - 4 if flags & CHECKSUM_PRESENT else len(data)
        pos, body = 4, None
        while pos < end:
            kind = data[pos]
            pos += 1
            (size,) = struct.unpack("<i", data[pos : pos + 4])
            if kind == 0:
                assert body is None, "two body sections"
                body = bson.decode(data[pos : pos + size])
            elif kind != 1:
                raise AssertionError(f"unknown section kind {kind}")
            pos += size
        assert pos == end, "sections do not add up to the frame"
        assert body is not None, "no body section"
        return Reply(rid, response_to, flags, body, compressed_with)

    def command(self, body: dict) -> dict:
        rid = self.send(body)
        reply = self.read()
        assert reply.response_to == rid, f"reply to another request: {reply.body}"
        assert not reply.more_to_come
        return reply.body

    def hello(self, **extra) -> dict:
        body = {
            "hello": 1,
            "client": {
                "application": {"name": "mongoguard-raw-test"},
                "driver": {"name": "mongoguard-tests", "version": "0"},
                "os": {"type": "Linux"},
            },
            **extra,
            "$db": "admin",
        }
        reply = self.command(body)
        assert reply.get("ok") == 1, reply
        return reply


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_hello_through_proxy(proxy_uri: str):
    client = MongoClient(proxy_client_uri(proxy_uri, appName="mongoguard-py-hello"))
    try:
        hello = client.admin.command("hello")
        assert hello["ok"] == 1
        assert hello["maxWireVersion"] >= 6
        for field in ("maxBsonObjectSize", "maxMessageSizeBytes", "maxWriteBatchSize"):
            assert hello.get(field, 0) > 0, f"{field} missing: {hello}"
        assert client.admin.command("ping")["ok"] == 1
        for legacy in ("isMaster", "ismaster"):
            assert client.admin.command(legacy)["ok"] == 1
    finally:
        client.close()


def test_hello_without_direct_connection_stays_on_the_proxy(proxy_uri: str):
    """Default discovery (no directConnection): the driver must only ever see the proxy."""
    client = MongoClient(with_options(proxy_uri, serverSelectionTimeoutMS=30000))
    try:
        hello = client.admin.command("hello")
        for field in ("hosts", "setName", "primary", "me", "passives", "arbiters"):
            assert field not in hello, f"hello through the proxy carries {field!r}: {hello}"
        parts = urlsplit(proxy_uri)
        expected = (parts.hostname, parts.port or 27017)
        assert client.address == expected
        assert set(client.nodes) == {expected}, f"driver discovered {client.nodes}"
    finally:
        client.close()


def test_crud(proxy_uri: str, direct: MongoClient, db_name: str):
    log = CommandLog()
    client = MongoClient(proxy_client_uri(proxy_uri), event_listeners=[log])
    try:
        crud_scenario(client, log, direct, db_name)
    finally:
        client.close()


def _negotiated_compressor_ids(client: MongoClient) -> set[int]:
    """Compressor ids of the client's idle pooled connections (0: none). pymongo internals:
    when they move this fails (to be updated), it never answers "unknown"."""
    ids = set()
    try:
        for server in client._topology._servers.values():
            for conn in list(server.pool.conns):
                ctx = conn.compression_context
                ids.add(ctx.compressor_id if ctx is not None else 0)
    except AttributeError as e:
        pytest.fail(f"pymongo internals moved, update _negotiated_compressor_ids: {e}")
    assert ids, "no idle pooled connection to inspect"
    return ids


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_crud_compressed(proxy_uri: str, direct: MongoClient, db_name: str, compressor: str):
    """Fails when the compressor was not negotiated (the scenario alone passes uncompressed).

    pymongo's public events do not show it (its monitoring connections never offer compression:
    topology_shared.py, _create_pool_for_monitor), so the pooled connections that carried the
    scenario are inspected; test_raw_compressed_messages checks the handshake reply itself."""
    log = CommandLog()
    client = MongoClient(proxy_client_uri(proxy_uri, compressors=compressor), event_listeners=[log])
    try:
        assert client.options.pool_options._compression_settings.compressors == [compressor], (
            f"pymongo dropped {compressor}: is its module installed?"
        )
        crud_scenario(client, log, direct, db_name)
        ids = _negotiated_compressor_ids(client)
        assert ids == {COMPRESSOR_IDS[compressor]}, (
            f"pooled connections through the proxy negotiated {ids}, "
            f"expected {{{COMPRESSOR_IDS[compressor]}}} ({compressor})"
        )
    finally:
        client.close()


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_raw_compressed_messages(proxy_uri: str, compressor: str):
    """The handshake through the proxy accepts the compressor, and OP_COMPRESSED works."""
    conn = RawConn(proxy_uri)
    try:
        hello = conn.hello(compression=[compressor])
        assert hello.get("compression") == [compressor], f"not negotiated: {hello}"
        conn.compressor = compressor
        for _ in range(3):
            rid = conn.send({"ping": 1, "$db": "admin"})
            reply = conn.read()
            assert reply.response_to == rid
            assert reply.body.get("ok") == 1, reply.body
    finally:
        conn.close()


def test_unacknowledged_writes_then_read(proxy_uri: str, direct: MongoClient, db_name: str):
    """w:0 writes go out as OP_MSG with moreToCome; a later read must see them."""
    client = MongoClient(proxy_client_uri(proxy_uri))
    try:
        coll = client[db_name]["w0"]
        w0 = coll.with_options(write_concern=WriteConcern(w=0))
        assert not w0.insert_one({"_id": "a", "v": 1}).acknowledged
        w0.insert_many([{"_id": f"m{i}", "v": i} for i in range(10)])
        w0.update_one({"_id": "a"}, {"$set": {"v": 2}})
        w0.delete_one({"_id": "m9"})
        # The same connection stays in step after the fire-and-forget messages.
        assert client.admin.command("ping")["ok"] == 1

        expected = sorted(
            [{"_id": "a", "v": 2}] + [{"_id": f"m{i}", "v": i} for i in range(9)],
            key=lambda d: d["_id"],
        )
        assert poll(lambda: list(coll.find({}).sort("_id", 1)) == expected), list(coll.find({}))
        assert list(direct[db_name]["w0"].find({}).sort("_id", 1)) == expected
    finally:
        client.close()


def test_raw_more_to_come_keeps_connection_in_step(
    proxy_uri: str, direct: MongoClient, db_name: str
):
    conn = RawConn(proxy_uri)
    try:
        conn.hello()
        for i in range(5):
            conn.send(
                {
                    "insert": "raw",
                    "documents": [{"_id": i}],
                    "writeConcern": {"w": 0},
                    "$db": db_name,
                },
                flags=MORE_TO_COME,
            )
        assert conn.command({"ping": 1, "$db": "admin"})["ok"] == 1
        expected = [{"_id": i} for i in range(5)]
        assert poll(lambda: list(direct[db_name]["raw"].find({}).sort("_id", 1)) == expected)
    finally:
        conn.close()


def test_exhaust_cursor(proxy_uri: str, direct: MongoClient, db_name: str):
    log = CommandLog()
    client = MongoClient(proxy_client_uri(proxy_uri), event_listeners=[log])
    try:
        coll = client[db_name]["docs"]
        coll.insert_many([original_doc(i) for i in range(N)])
        try:
            cursor = coll.find({}, cursor_type=CursorType.EXHAUST, batch_size=BATCH).sort("_id", 1)
            got = list(cursor)
        except InvalidOperation as e:
            # pymongo refuses exhaust when the server says it is a mongos older than 7.1.
            hello = client.admin.command("hello")
            pytest.skip(
                f"pymongo refuses exhaust through the proxy ({e}); the proxy's hello says "
                f"msg={hello.get('msg')!r} maxWireVersion={hello.get('maxWireVersion')}; the raw "
                "exhaust test covers the proxy's relaying"
            )
        assert got == [original_doc(i) for i in range(N)]
        assert direct[db_name]["docs"].count_documents({}) == N
        # Connections are usable afterwards.
        assert coll.count_documents({}) == N
    finally:
        client.close()


def test_raw_exhaust_getmore_stream(proxy_uri: str, direct: MongoClient, db_name: str):
    direct_coll = direct[db_name]["docs"]
    docs = [original_doc(i) for i in range(N)]
    client = MongoClient(proxy_client_uri(proxy_uri))
    try:
        client[db_name]["docs"].insert_many(docs)
    finally:
        client.close()

    conn = RawConn(proxy_uri)
    try:
        conn.hello()
        first = conn.command(
            {"find": "docs", "filter": {}, "sort": {"_id": 1}, "batchSize": BATCH, "$db": db_name}
        )
        got = list(first["cursor"]["firstBatch"])
        cursor_id = first["cursor"]["id"]
        assert len(got) == BATCH and cursor_id != 0, first
        rid = conn.send(
            {"getMore": Int64(cursor_id), "collection": "docs", "batchSize": BATCH, "$db": db_name},
            flags=EXHAUST_ALLOWED,
        )
        replies = 0
        while True:
            reply = conn.read()
            replies += 1
            if replies == 1:
                assert reply.response_to == rid
            assert reply.body.get("ok") == 1, reply.body
            got.extend(reply.body["cursor"]["nextBatch"])
            if not reply.more_to_come:
                assert reply.body["cursor"]["id"] == 0, "exhaust stream ended early"
                break
            assert replies < 100, "exhaust stream does not end"
        assert got == docs
        assert replies > 1, "exhaustAllowed getMore answered by one reply: nothing streamed"
        assert conn.command({"ping": 1, "$db": "admin"})["ok"] == 1
    finally:
        conn.close()
    assert direct_coll.count_documents({}) == N


def test_two_hundred_concurrent_clients(proxy_uri: str, direct: MongoClient, db_name: str):
    clients = 200
    uri = proxy_client_uri(proxy_uri, maxPoolSize=2, serverSelectionTimeoutMS=120000)
    start = threading.Barrier(clients, timeout=120)

    def one(i: int) -> str | None:
        client = MongoClient(uri)
        try:
            start.wait()
            coll = client[db_name]["c"]
            doc = {"_id": i, "client": f"client-{i}"}
            coll.insert_one(doc)
            back = coll.find_one({"_id": i})
            return None if back == doc else f"client {i}: read back {back!r}"
        except Exception as e:  # noqa: BLE001 - every failure is reported
            return f"client {i}: {type(e).__name__}: {e}"
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=clients) as pool:
        failures = [f for f in pool.map(one, range(clients)) if f]
    assert not failures, f"{len(failures)} of {clients} clients failed: {failures[:10]}"
    stored = list(direct[db_name]["c"].find({}).sort("_id", 1))
    assert stored == [{"_id": i, "client": f"client-{i}"} for i in range(clients)]
