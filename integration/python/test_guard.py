"""Policy enforcement through pymongo.

The proxy under test runs the built-in `standard` profile. A blocked command must come back
as an OperationFailure with code 65001 (`MongoguardPolicyViolation`), the rule id in its
message and no error labels; pymongo must make exactly one attempt (command monitoring) and
never clear its pool; the data must be unchanged upstream (checked through the direct URI,
which works the same whether the upstream is the stand-in or a real mongod); and the same
client must keep working. A warn-only rule (W004, delete_many with a real filter) is forwarded.

Environment (the same as test_drivers.py):
  MONGOGUARD_PROXY_URI   mongodb:// URI of the mongoguard proxy under test
  MONGOGUARD_DIRECT_URI  mongodb:// URI of the upstream the proxy fronts

Every test name contains "guard", so `bash integration/run_local.sh -k guard` runs exactly
this file.
"""

from __future__ import annotations

import os
import threading
import uuid
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from pymongo import MongoClient, UpdateMany, UpdateOne, monitoring
from pymongo.errors import BulkWriteError, OperationFailure
from pymongo.write_concern import WriteConcern

BLOCK_CODE = 65001
BLOCK_CODE_NAME = "MongoguardPolicyViolation"
BLOCK_PREFIX = "mongoguard blocked this command: "

SEED = [
    {"_id": 1, "v": 1, "g": "a"},
    {"_id": 2, "v": 2, "g": "a"},
    {"_id": 3, "v": 3, "g": "b"},
]


# --------------------------------------------------------------------------------------------
# URIs and clients
# --------------------------------------------------------------------------------------------


def _with_options(uri: str, **opts: object) -> str:
    parts = urlsplit(uri)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in opts]
    for k, v in opts.items():
        query.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def _env(name: str) -> str:
    uri = os.environ.get(name)
    if not uri:
        pytest.fail(f"{name} is not set (integration/run_local.sh sets it)")
    return uri


def _direct_client_uri(direct_uri: str) -> str:
    opts: dict[str, object] = {"serverSelectionTimeoutMS": 30000}
    if "directconnection=" not in direct_uri.lower():
        opts["directConnection"] = True
    return _with_options(direct_uri, **opts)


class Watch(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Records the commands pymongo started and the pools it cleared."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started_events: list[tuple[str, dict]] = []
        self.pool_clears = 0

    # CommandListener
    def started(self, event) -> None:
        with self.lock:
            self.started_events.append((event.command_name, dict(event.command)))

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass

    # ConnectionPoolListener
    def pool_created(self, event) -> None:
        pass

    def pool_ready(self, event) -> None:
        pass

    def pool_cleared(self, event) -> None:
        with self.lock:
            self.pool_clears += 1

    def pool_closed(self, event) -> None:
        pass

    def connection_created(self, event) -> None:
        pass

    def connection_ready(self, event) -> None:
        pass

    def connection_closed(self, event) -> None:
        pass

    def connection_check_out_started(self, event) -> None:
        pass

    def connection_check_out_failed(self, event) -> None:
        pass

    def connection_checked_out(self, event) -> None:
        pass

    def connection_checked_in(self, event) -> None:
        pass

    def count(self, name: str) -> int:
        with self.lock:
            return sum(1 for n, _ in self.started_events if n == name)

    def last(self, name: str) -> dict:
        with self.lock:
            for n, cmd in reversed(self.started_events):
                if n == name:
                    return cmd
        raise AssertionError(f"pymongo never started {name}")


@pytest.fixture(scope="module")
def guard_proxy_uri() -> str:
    return _env("MONGOGUARD_PROXY_URI")


@pytest.fixture(scope="module")
def guard_direct_uri() -> str:
    return _env("MONGOGUARD_DIRECT_URI")


@pytest.fixture
def guard_direct(guard_direct_uri: str):
    client = MongoClient(_direct_client_uri(guard_direct_uri))
    yield client
    client.close()


@pytest.fixture
def guard_watch() -> Watch:
    return Watch()


@pytest.fixture
def guard_client(guard_proxy_uri: str, guard_watch: Watch):
    uri = _with_options(
        guard_proxy_uri,
        serverSelectionTimeoutMS=30000,
        connectTimeoutMS=20000,
        directConnection=True,
    )
    client = MongoClient(uri, event_listeners=[guard_watch])
    client.admin.command("ping")
    yield client
    client.close()


@pytest.fixture
def guard_db(request, guard_direct: MongoClient):
    """A unique database seeded through the direct URI; dropped afterwards."""
    tag = "".join(c if c.isalnum() else "_" for c in request.node.name)[:24]
    name = f"mgt_pyg_{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    guard_direct[name]["c"].insert_many([dict(d) for d in SEED])
    yield name
    guard_direct.drop_database(name)


# --------------------------------------------------------------------------------------------
# Assertions
# --------------------------------------------------------------------------------------------


def assert_blocked(exc: OperationFailure, rule: str) -> None:
    details = exc.details or {}
    assert exc.code == BLOCK_CODE, f"code {exc.code}: {details}"
    assert details.get("codeName") == BLOCK_CODE_NAME, details
    errmsg = details.get("errmsg", "")
    assert errmsg.startswith(BLOCK_PREFIX), details
    assert rule in errmsg, f"{rule} not in {errmsg!r}"
    # Errors that teach: the rule's part of the message ends with what to do instead.
    after = errmsg[errmsg.index(rule):]
    assert ". Instead: " in after and not after.endswith("Instead: "), errmsg
    assert rule in str(exc), str(exc)
    assert "errorLabels" not in details, f"a block must carry no errorLabels: {details}"
    for label in ("RetryableWriteError", "TransientTransactionError", "NoWritesPerformed"):
        assert not exc.has_error_label(label), f"{label} on a block: {details}"


def stored(direct: MongoClient, db: str) -> list[dict]:
    return list(direct[db]["c"].find({}).sort("_id", 1))


def assert_unchanged(direct: MongoClient, db: str) -> None:
    assert stored(direct, db) == SEED, "the data changed upstream"


def assert_still_works(client: MongoClient, watch: Watch, db: str) -> None:
    assert client[db]["c"].find_one({"_id": 1}) == SEED[0]
    assert client.admin.command("ping")["ok"] == 1
    assert watch.pool_clears == 0, "pymongo cleared its pool after a block"


def expect_blocked(watch: Watch, command: str, rule: str, op) -> OperationFailure:
    before = watch.count(command)
    with pytest.raises(OperationFailure) as info:
        op()
    assert watch.count(command) - before == 1, f"{rule}: pymongo retried {command}"
    assert_blocked(info.value, rule)
    return info.value


# --------------------------------------------------------------------------------------------
# Blocked (standard profile)
# --------------------------------------------------------------------------------------------


def test_guard_update_many_without_filter_is_blocked(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    exc = expect_blocked(
        guard_watch, "update", "W001", lambda: coll.update_many({}, {"$set": {"x": 1}})
    )
    assert "multi-update-without-filter" in exc.details["errmsg"]
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_update_many_tautology_is_blocked(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    expect_blocked(
        guard_watch,
        "update",
        "W001",
        lambda: coll.update_many({"_id": {"$exists": True}}, {"$set": {"x": 1}}),
    )
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_measured_always_true_filter_is_w001(guard_client, guard_watch, guard_direct, guard_db):
    """A filter the prover cannot decide ({_id: {$gt: 0}} depends on the data) is measured
    against the data before the write is forwarded: it matches every document, so W001, as a
    clean, non-retryable error on a connection that stays usable."""
    coll = guard_client[guard_db]["c"]
    exc = expect_blocked(
        guard_watch,
        "update",
        "W001",
        lambda: coll.update_many({"_id": {"$gt": 0}}, {"$set": {"x": 1}}),
    )
    assert "measured" in exc.details["errmsg"], exc.details
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_measured_selective_filter_is_forwarded(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    n = len(SEED)
    result = coll.update_many({"_id": {"$gt": 1}}, {"$set": {"x": 1}})
    assert result.modified_count == n - 1, result.raw_result
    assert sum(1 for d in stored(guard_direct, guard_db) if d.get("x") == 1) == n - 1


def test_guard_delete_many_without_filter_is_blocked(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    exc = expect_blocked(guard_watch, "delete", "W003", lambda: coll.delete_many({}))
    assert "delete-many-without-filter" in exc.details["errmsg"]
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_insert_into_admin_is_blocked(guard_client, guard_watch, guard_direct, guard_db):
    target = f"mgt_pyg_admin_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        # insert_one is a retryable write: a block must still be one attempt.
        expect_blocked(
            guard_watch,
            "insert",
            "W005",
            lambda: guard_client.admin[target].insert_one({"_id": 1}),
        )
        assert guard_direct.admin[target].count_documents({}) == 0, "the insert reached admin"
    finally:
        if guard_direct.admin[target].count_documents({}) > 0:
            guard_direct.admin.drop_collection(target)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_insert_into_system_js_is_blocked(guard_client, guard_watch, guard_direct, guard_db):
    expect_blocked(
        guard_watch,
        "insert",
        "W005",
        lambda: guard_client[guard_db]["system.js"].insert_one({"_id": "f", "value": "x"}),
    )
    assert guard_direct[guard_db]["system.js"].count_documents({}) == 0
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_journal_disabled_write_concern_is_blocked(
    guard_client, guard_watch, guard_direct, guard_db
):
    coll = guard_client[guard_db].get_collection("c", write_concern=WriteConcern(j=False))
    expect_blocked(
        guard_watch, "insert", "W006", lambda: coll.insert_one({"_id": 10, "v": 10, "g": "c"})
    )
    sent = guard_watch.last("insert")
    assert sent.get("writeConcern", {}).get("j") is False, f"pymongo sent {sent}"
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_bulk_write_update_many_without_filter_is_blocked(
    guard_client, guard_watch, guard_direct, guard_db
):
    coll = guard_client[guard_db]["c"]
    before = guard_watch.count("update")
    with pytest.raises(OperationFailure) as info:
        coll.bulk_write(
            [
                UpdateOne({"_id": 1}, {"$set": {"y": 1}}),
                UpdateMany({}, {"$set": {"x": 1}}),
            ]
        )
    exc = info.value
    # The proxy answers the whole `update` command with ok: 0, which pymongo reports as a
    # command error (not a BulkWriteError with per-statement writeErrors).
    assert not isinstance(exc, BulkWriteError), f"unexpected BulkWriteError: {exc.details}"
    assert_blocked(exc, "W001")
    assert "(statement 1)" in exc.details["errmsg"], exc.details
    assert guard_watch.count("update") - before == 1, "pymongo retried the bulk update"
    # The harmless first statement was not applied either: the batch was blocked whole.
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_blocks_never_retry_nor_clear_the_pool(
    guard_client, guard_watch, guard_direct, guard_db
):
    coll = guard_client[guard_db]["c"]
    for _ in range(5):
        expect_blocked(
            guard_watch, "update", "W001", lambda: coll.update_many({}, {"$set": {"x": 1}})
        )
        expect_blocked(guard_watch, "delete", "W003", lambda: coll.delete_many({}))
    assert guard_watch.count("update") == 5
    assert guard_watch.count("delete") == 5
    assert_unchanged(guard_direct, guard_db)
    assert_still_works(guard_client, guard_watch, guard_db)


# --------------------------------------------------------------------------------------------
# Forwarded
# --------------------------------------------------------------------------------------------


def test_guard_delete_many_with_filter_only_warns(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    r = coll.delete_many({"g": "b"})
    assert r.deleted_count == 1
    assert guard_watch.count("delete") == 1
    assert stored(guard_direct, guard_db) == SEED[:2], "the delete did not happen upstream"
    assert_still_works(guard_client, guard_watch, guard_db)


def test_guard_update_one_without_filter_only_warns(guard_client, guard_watch, guard_direct, guard_db):
    # W002 is a warning in the standard profile.
    r = guard_client[guard_db]["c"].update_one({}, {"$set": {"x": 1}})
    assert r.matched_count == 1
    assert sum(1 for d in stored(guard_direct, guard_db) if d.get("x") == 1) == 1


def test_guard_conditioned_writes_pass(guard_client, guard_watch, guard_direct, guard_db):
    coll = guard_client[guard_db]["c"]
    r = coll.update_many({"g": "a"}, {"$set": {"x": 1}})
    assert (r.matched_count, r.modified_count) == (2, 2)
    coll.insert_one({"_id": 4, "v": 4, "g": "b"})
    docs = stored(guard_direct, guard_db)
    assert len(docs) == 4
    assert [d["_id"] for d in docs if d.get("x") == 1] == [1, 2]
