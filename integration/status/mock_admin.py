#!/usr/bin/env python3
"""A stand-in for mongoguard's admin listener (its API is described in README.md, "Metrics and
admin API"), for developing and testing the status page without a running mongoguard.

Serves src/admin/status.html at GET / (re-read on every request, so edits show on reload) and
realistic JSON for every endpoint of the admin API: /healthz, /readyz, /metrics, /policy,
POST /reload, /violations, /stats/violations, /clients, /shapes, /pool.

    python3 integration/status/mock_admin.py [--port 9216] [--token T] [--mode pooled|passthrough]
        [--field-style contract|audit] [--unready] [--hostile]

Prints "listening on http://127.0.0.1:PORT/" on stdout once bound (--port 0 picks a free port).

The data: the standard policy (enforce), two applications (billing, reports), violations of
W003 (3 in the last hour, block) and W001 (2, block) plus Q001 warnings, a pooled pool with two
servers, and query shapes. Counters of requests grow with time so every poll differs.

--field-style audit writes violation records with the audit JSON line's key names (rule, app,
db, statement, filter_shape as embedded JSON) instead of the `contract` style's (rule_id, app_name,
database, statement_index, filter_shape as a string); the page accepts both.
--hostile adds an application and a violation whose client-controlled text is HTML/script, to
check that the page escapes it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "src", "admin", "status.html")

RULES = [
    ("W001", "multi-update-without-filter", "block"),
    ("W002", "update-without-filter", "warn"),
    ("W003", "delete-many-without-filter", "block"),
    ("W004", "delete-many", "warn"),
    ("W005", "system-namespace-write", "block"),
    ("W006", "journal-disabled", "block"),
    ("W007", "unacknowledged-write", "warn"),
    ("W008", "drop-database", "warn"),
    ("W009", "rename-collection", "warn"),
    ("W010", "whole-document-replace", "off"),
    ("W011", "unbounded-array-push", "warn"),
    ("Q001", "negation-operator", "warn"),
    ("Q002", "server-side-javascript", "warn"),
    ("Q003", "unanchored-regex", "warn"),
    ("G001", "unreadable-command", "block"),
]
RULE_NAMES = {r[0]: r[1] for r in RULES}
REASONS = {
    "W001": "a multi-document update whose filter matches every document rewrites the whole collection",
    "W003": "a multi-document delete whose filter matches every document empties the collection",
    "Q001": "$ne, $nin and $not cannot use an index well; rewrite as $in",
}
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'

STARTED = time.time()

# The headers the mock (and, suggested, the real server) sends with the page: a strict CSP
# that still lets the inline script and styles run and allows requests to the same origin only.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def rfc3339(t: float) -> str:
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        now = time.time()
        # (seconds ago, rule, app, driver, db, collection, command, statement, shape, hash)
        self.events = [
            (40, "W003", "billing", "PyMongo 4.8.0", "shop", "orders", "delete", 0, {}, "9f2c1a7e3b5d4c60"),
            (95, "Q001", "reports", "nodejs 6.8.0", "shop", "customers", "find", None,
             {"status": {"$ne": "<string>"}}, "1b7e4d2a9c3f5e81"),
            (210, "W001", "billing", "PyMongo 4.8.0", "shop", "invoices", "update", 1, {}, "77aa0c3d2e1f9b45"),
            (420, "W003", "reports", "nodejs 6.8.0", "analytics", "events", "delete", 0, {}, "c0ffee1234abcd56"),
            (730, "Q001", "reports", "nodejs 6.8.0", "shop", "customers", "find", None,
             {"status": {"$ne": "<string>"}}, "1b7e4d2a9c3f5e81"),
            (1300, "W001", "billing", "PyMongo 4.8.0", "shop", "invoices", "update", 0, {}, "77aa0c3d2e1f9b45"),
            (1850, "Q001", "billing", "PyMongo 4.8.0", "shop", "orders", "find", None,
             {"customer_id": "<objectId>", "state": {"$nin": ["<string>"]}}, "5d5d0e0e1a1a2b2b"),
            (2400, "W003", "billing", "PyMongo 4.8.0", "shop", "carts", "delete", 0, {}, "0a0b0c0d0e0f1011"),
            (3100, "Q001", "reports", "nodejs 6.8.0", "shop", "customers", "find", None,
             {"status": {"$ne": "<string>"}}, "1b7e4d2a9c3f5e81"),
        ]
        if args.hostile:
            self.events.insert(0, (20, "Q001", HOSTILE, HOSTILE, "shop", "orders", "find", None,
                                   {HOSTILE: "<string>"}, "dddddddddddddddd"))
        self.base = now

    # -- endpoints --------------------------------------------------------------------------
    def policy(self) -> dict:
        return {
            "source": "builtin:standard",
            "hash": "3f9a0c6e12b47d55",
            "mode": "enforce",
            "rules": [{"id": i, "name": n, "action": a} for i, n, a in RULES],
        }

    def _events_in_window(self, now: float) -> list[tuple[float, tuple]]:
        # Each event happened e[0] seconds before start-up; one that ages out of the hour comes
        # back as a new one, so the counts stay the same however long the mock runs.
        out = []
        for e in self.events:
            age = (e[0] + (now - self.base)) % 3600
            out.append((now - age, e))
        return out

    def violations(self, limit: int) -> dict:
        now = time.time()
        recs = []
        for t, e in sorted(self._events_in_window(now), key=lambda x: -x[0]):
            _, rule, app, driver, db, coll, cmd, stmt, shape, shash = e
            action = dict((r[0], r[2]) for r in RULES)[rule]
            if self.args.field_style == "audit":
                rec = {"time": rfc3339(t), "rule": rule, "rule_name": RULE_NAMES[rule],
                       "reason": REASONS.get(rule, ""), "action": action, "mode": "enforce",
                       "app": app, "driver": driver, "user": "svc_" + app[:8] if app != HOSTILE else HOSTILE,
                       "db": db, "collection": coll, "command": cmd}
                if stmt is not None:
                    rec["statement"] = stmt
                rec.update({"filter_shape": shape, "shape_hash": shash, "request_id": int(t) % 100000,
                            "source": "proxy"})
            else:
                rec = {"time": rfc3339(t), "rule_id": rule, "rule_name": RULE_NAMES[rule],
                       "reason": REASONS.get(rule, ""), "action": action, "mode": "enforce",
                       "app_name": app, "driver": driver, "user": "svc_" + app[:8] if app != HOSTILE else HOSTILE,
                       "database": db, "collection": coll, "command": cmd, "statement_index": stmt,
                       "filter_shape": json.dumps(shape, separators=(",", ":")), "shape_hash": shash,
                       "request_id": int(t) % 100000, "source": "proxy"}
            recs.append(rec)
        return {"violations": recs[:limit]}

    def stats(self) -> dict:
        now = time.time()
        minute_now = int(now // 60) * 60
        starts = [minute_now - 60 * (59 - i) for i in range(60)]
        buckets = [{"start": rfc3339(s), "by_rule": {}} for s in starts]
        by_rule: dict[str, int] = {}
        by_app: dict[str, int] = {}
        for t, e in self._events_in_window(now):
            rule, app = e[1], e[2]
            by_rule[rule] = by_rule.get(rule, 0) + 1
            by_app[app] = by_app.get(app, 0) + 1
            idx = int((int(t // 60) * 60 - starts[0]) // 60)
            if 0 <= idx < 60:
                b = buckets[idx]["by_rule"]
                b[rule] = b.get(rule, 0) + 1
        return {"window_seconds": 3600, "bucket_seconds": 60, "buckets": buckets,
                "by_rule": by_rule, "by_app": by_app}

    def clients(self) -> dict:
        up = int(time.time() - STARTED)
        out = [
            {"app": "billing", "driver": "PyMongo 4.8.0", "connections": 3, "requests": 1200 + 7 * up,
             "violations": 5},
            {"app": "reports", "driver": "nodejs 6.8.0", "connections": 2, "requests": 310 + 2 * up,
             "violations": 6,
             "findings": ["C001 short-lived-connections: 75 connections opened in the last minute "
                          "(more than 60), 1.0 requests per closed connection (fewer than 5; 75 closed, "
                          "monitoring and authentication not counted)"]},
        ]
        if self.args.hostile:
            out.append({"app": HOSTILE, "driver": HOSTILE, "connections": 1, "requests": 1, "violations": 1})
        return {"clients": out}

    def shapes(self, limit: int, sort: str) -> dict:
        up = int(time.time() - STARTED)
        rows = [
            ("shop.orders", "find", '{"customer_id": ?, "state": {"$in": ?}}', "4e1d9a0b7c2f3e68", 5400 + 3 * up, 0, 0, 180, 420, 2100),
            ("shop.customers", "find", '{"status": {"$ne": ?}}', "1b7e4d2a9c3f5e81", 210 + up, 0, 4, 2400, 9100, 48000),
            ("analytics.events", "aggregate", '[{"$match": {"ts": {"$gte": ?}}}, {"$group": ?}]', "a1b2c3d4e5f60718", 96, 1, 0, 38000, 91000, 250000),
            ("shop.invoices", "update", '{}', "77aa0c3d2e1f9b45", 2, 2, 2, 0, 0, 0),
            ("shop.orders", "insert", "", "00c0ffee00c0ffee", 2600 + 2 * up, 0, 0, 210, 380, 1500),
            ("shop.carts", "delete", '{}', "0a0b0c0d0e0f1011", 1, 1, 1, 0, 0, 0),
            ("shop.sessions", "getMore", '{"user_id": ?}', "3333444455556666", 820, 0, 0, 95, 140, 700),
            ("shop.orders", "delete", '{"_id": ?}', "1212121234343434", 430, 0, 0, 250, 510, 1900),
        ]
        out = []
        for ns, cmd, shape, h, count, errors, viol, p50, p95, p99 in rows:
            out.append({"namespace": ns, "command": cmd, "filter_shape": shape, "shape_hash": h,
                        "count": count, "errors": errors, "violations": viol,
                        "total_time_us": count * max(p50, 1) * 11 // 10,
                        "latency_us": {"p50": p50, "p95": p95, "p99": p99}})
        key = (lambda s: s["count"]) if sort == "count" else (lambda s: s["total_time_us"])
        out.sort(key=key, reverse=True)
        return {"shapes": out[:limit]}

    def pool(self) -> dict:
        if self.args.mode == "passthrough":
            return {"mode": "passthrough", "clients": {"active": 5, "waiting": 0}, "pools": [],
                    "pinned": {"exhaust": 0, "transaction": 0, "cursor": 0, "legacy_write": 0}}
        tick = int(time.time() - STARTED) % 4
        return {
            "mode": "pooled",
            "clients": {"active": 48, "waiting": 1 if tick == 0 else 0},
            "pools": [
                {"server": "db1.internal:27017", "identity": "default", "total": 20, "idle": 8 + tick,
                 "in_use": 12 - tick, "waiting": 1 if tick == 0 else 0, "max_wait_ms": 14},
                {"server": "db2.internal:27017", "identity": "default", "total": 10, "idle": 9,
                 "in_use": 1, "waiting": 0, "max_wait_ms": 0},
                {"server": "db1.internal:27017", "identity": "reporting", "total": 5, "idle": 3,
                 "in_use": 2, "waiting": 0, "max_wait_ms": 3},
            ],
            "pinned": {"exhaust": 0, "transaction": 2, "cursor": 5, "legacy_write": 0},
        }

    def metrics(self) -> str:
        lines = ["# TYPE mongoguard_blocked_requests counter", "mongoguard_blocked_requests_total 5"]
        for rule, n in self.stats()["by_rule"].items():
            lines.append(f'mongoguard_violations_total{{rule="{rule}",action="block",mode="enforce"}} {n}')
        lines.append("# EOF")
        return "\n".join(lines) + "\n"


def make_handler(state: State):
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        server_version = "mongoguard-mock-admin"

        def log_message(self, fmt: str, *a) -> None:  # quiet unless asked
            if args.verbose:
                sys.stderr.write("mock_admin: " + (fmt % a) + "\n")

        def _send(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def _authorized(self, path: str) -> bool:
            if not args.token or path == "/healthz":
                return True
            return self.headers.get("Authorization", "") == "Bearer " + args.token

        def do_GET(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            path, q = url.path, parse_qs(url.query)
            if path == "/":
                # The page itself carries no data; the real server may still gate it with the
                # token. The mock serves it openly so a 401 banner can be shown.
                with open(PAGE, "rb") as f:
                    return self._send(200, f.read(), "text/html; charset=utf-8", PAGE_HEADERS)
            if path == "/healthz":
                return self._json(200, {"status": "ok"})
            if not self._authorized(path):
                return self._json(401, {"error": "unauthorized"})
            if path in args.fail:
                return self._json(500, {"error": "mock failure (--fail)"})
            try:
                limit = int(q.get("limit", ["0"])[0]) or None
            except ValueError:
                return self._json(400, {"error": "bad limit"})
            if path == "/readyz":
                if args.unready:
                    return self._json(503, {"status": "unready", "error": "upstream 127.0.0.1:27018: connection refused"})
                return self._json(200, {"status": "ready", "upstream": "db1.internal:27017"})
            if path == "/metrics":
                return self._send(200, state.metrics().encode(),
                                  "application/openmetrics-text; version=1.0.0; charset=utf-8")
            if path == "/policy":
                return self._json(200, state.policy())
            if path == "/violations":
                return self._json(200, state.violations(min(limit or 100, 1000)))
            if path == "/stats/violations":
                return self._json(200, state.stats())
            if path == "/clients":
                return self._json(200, state.clients())
            if path == "/shapes":
                return self._json(200, state.shapes(limit or 50, q.get("sort", ["time"])[0]))
            if path == "/pool":
                return self._json(200, state.pool())
            return self._json(404, {"error": "not found"})

        do_HEAD = do_GET

        def do_POST(self) -> None:  # noqa: N802
            path = urlsplit(self.path).path
            if not self._authorized(path):
                return self._json(401, {"error": "unauthorized"})
            if path == "/reload":
                return self._json(409, {"ok": False, "error": "the policy is built in: nothing to reload"})
            return self._json(404, {"error": "not found"})

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9216)
    ap.add_argument("--token", default="")
    ap.add_argument("--mode", choices=["pooled", "passthrough"], default="pooled")
    ap.add_argument("--field-style", choices=["contract", "audit"], default="contract")
    ap.add_argument("--unready", action="store_true", help="/readyz answers 503")
    ap.add_argument("--hostile", action="store_true", help="add HTML/script in client-controlled text")
    ap.add_argument("--fail", action="append", default=[], metavar="PATH", help="answer 500 on PATH (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    state = State(args)
    srv = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    srv.daemon_threads = True
    host, port = srv.server_address[:2]
    print(f"listening on http://{host}:{port}/", flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
