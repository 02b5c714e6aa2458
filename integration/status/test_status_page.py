"""The status page (src/admin/status.html) in a real headless Chromium, driven by Playwright.

Against the mock admin server (integration/status/mock_admin.py, started here) by default, or
against a running mongoguard with MONGOGUARD_ADMIN_URL=http://127.0.0.1:9216/ (then
MONGOGUARD_ADMIN_TOKEN is passed as ?token=... when the admin listener needs one).

Environment (expectations default to the mock's data; against a real server unset ones become
"at least one"):
  MONGOGUARD_ADMIN_URL     base URL of a running admin listener (default: start the mock)
  MONGOGUARD_ADMIN_TOKEN   bearer token for it (optional)
  EXPECT_RULE              a rule that must have a bar in "violations by rule" (default W003)
  EXPECT_RULE_COUNT        its exact count (mock: 3; real: unset = at least 1)
  EXPECT_POLICY_MODE       enforce|audit (mock: enforce; real: unset = either)
  EXPECT_POOL_MODE         pooled|passthrough (mock: pooled; real: unset = either)
  EXPECT_MIN_VIOLATIONS    minimum rows in "latest violations" (default 1)
  EXPECT_MIN_SHAPES        minimum rows in "top query shapes" (default 1)
  ARTIFACTS_DIR            where status-page.png goes (default target/artifacts)
  CHROMIUM                 the browser binary (default /usr/bin/chromium)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
from playwright.sync_api import expect, sync_playwright  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MOCK = HERE / "mock_admin.py"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REAL_URL = os.environ.get("MONGOGUARD_ADMIN_URL", "").strip()
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR") or REPO / "target" / "artifacts")
MOCK_TOKEN = "s3cret-mock-token"
WAIT_MS = 15_000


def env(name: str, mock_default: str | None) -> str | None:
    """The expectation NAME: the environment's, else the mock's default (none for a real server)."""
    v = os.environ.get(name)
    if v is not None and v != "":
        return v
    return None if REAL_URL else mock_default


class MockServer:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(MOCK), "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.match(r"listening on (http://\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"mock admin server did not start: {line!r}")
        self.url = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def browser_context():
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (integration/status/run.sh does)")
    profile = tempfile.mkdtemp(prefix="mongoguard-status-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1440, "height": 1000},
            locale="en-US",
            timezone_id="UTC",
        )
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser_context):
    pg = browser_context.new_page()
    pg.errors = []  # uncaught exceptions in the page
    pg.requests = []  # every URL the page asked for
    pg.console_errors = []  # console errors: failed loads, CSP refusals
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.console_errors.append(m.text) if m.type == "error" else None)
    pg.on("request", lambda r: pg.requests.append(r.url))
    yield pg
    pg.close()


# Targets: the real server once, or the mock in two flavours (contract key names, pooled,
# with a token; audit-line key names, passthrough, no token).
if REAL_URL:
    TARGETS = [pytest.param({"real": True}, id="real")]
else:
    TARGETS = [
        pytest.param({"args": ["--token", MOCK_TOKEN], "token": MOCK_TOKEN, "pool": "pooled"}, id="mock-pooled-token"),
        pytest.param({"args": ["--field-style", "audit", "--mode", "passthrough"], "pool": "passthrough"},
                     id="mock-passthrough-auditkeys"),
    ]


@pytest.fixture(params=TARGETS)
def target(request):
    t = dict(request.param)
    if t.get("real"):
        t["url"] = REAL_URL if REAL_URL.endswith("/") else REAL_URL + "/"
        t["token"] = os.environ.get("MONGOGUARD_ADMIN_TOKEN") or None
        t["pool"] = None
        yield t
        return
    mock = MockServer(*t["args"])
    t["url"] = mock.url
    try:
        yield t
    finally:
        mock.stop()


def open_page(page, url: str, token: str | None) -> None:
    page.goto(url + (f"?token={token}" if token else ""), wait_until="domcontentloaded")


def test_status_page_renders_and_refreshes(page, target, request):
    open_page(page, target["url"], target.get("token"))

    # Header: policy and health.
    policy = page.locator("#policy")
    expect(policy).to_have_attribute("data-mode", re.compile(r"^(enforce|audit)$"), timeout=WAIT_MS)
    want_mode = env("EXPECT_POLICY_MODE", "enforce")
    if want_mode:
        expect(policy).to_have_attribute("data-mode", want_mode)
        expect(page.locator("#policy-mode")).to_have_text(want_mode)
    expect(page.locator("#policy-hash")).to_have_text(re.compile(r"^[0-9a-f]{16}$"))
    expect(page.locator("#policy-source")).to_have_text(re.compile(r"^(builtin:|file:).+"))
    expect(page.locator("#health")).to_have_attribute("data-status", re.compile(r"^(ready|unready)$"))
    if not target.get("real"):
        expect(page.locator("#health")).to_have_attribute("data-status", "ready")

    # Violations by rule: a bar for the expected rule with the right count.
    rule = os.environ.get("EXPECT_RULE") or "W003"
    bar = page.locator(f'#violations-by-rule [data-rule="{rule}"]')
    expect(bar, f"a bar for {rule} in #violations-by-rule").to_have_count(1, timeout=WAIT_MS)
    count = int(bar.get_attribute("data-count"))
    want_count = env("EXPECT_RULE_COUNT", "3")
    if want_count is not None:
        assert count == int(want_count), f"{rule}: {count} in the page, {want_count} expected"
        expect(bar.locator(".bar-count")).to_have_text(f"{int(want_count):,}")
    else:
        assert count >= 1
    expect(bar.locator(".rule-id")).to_have_text(rule)
    if not target.get("real"):
        expect(bar).to_contain_text("delete-many-without-filter")
        expect(bar).to_have_attribute("data-action", "block")
        expect(page.locator('#violations-by-rule [data-rule="W001"]')).to_have_attribute("data-count", "2")
        # the per-minute sparkline has the 60 buckets
        expect(page.locator("#violations-sparkline rect")).to_have_count(60)
    bar_width = bar.locator(".bar-fill").bounding_box()["width"]
    assert bar_width > 1, "the bar has no width"

    # Latest violations: rows with rule id, namespace and command.
    rows = page.locator("#latest-violations tbody tr[data-rule]")
    min_rows = int(os.environ.get("EXPECT_MIN_VIOLATIONS") or 1)
    expect(rows.nth(min_rows - 1)).to_be_attached(timeout=WAIT_MS)
    assert rows.count() <= 20
    if not target.get("real"):
        assert rows.count() == 9
        first = rows.first
        expect(first).to_have_attribute("data-rule", "W003")
        expect(first).to_contain_text("delete-many-without-filter")
        expect(first).to_contain_text("shop.orders")
        expect(first).to_contain_text("delete")
        expect(first).to_contain_text("billing")
        expect(first.locator("td.shape")).to_have_text("{}")
        expect(page.locator('#latest-violations tbody tr[data-rule="W001"]').first).to_contain_text("shop.invoices")
        # the Q001 row's shape (a string in the contract style, embedded JSON in the audit style)
        expect(page.locator('#latest-violations tbody tr[data-rule="Q001"] td.shape').first).to_contain_text('"$ne"')

    # Top applications.
    apps = page.locator("#top-apps tbody tr[data-app]")
    expect(apps.first).to_be_attached(timeout=WAIT_MS)
    if not target.get("real"):
        expect(page.locator('#top-apps tr[data-app="billing"]')).to_have_attribute("data-violations", "5")
        expect(page.locator('#top-apps tr[data-app="reports"]')).to_have_attribute("data-violations", "4")
        # connection standards found for an application (/clients "findings")
        expect(page.locator('#top-apps tr[data-app="reports"] td.findings')).to_have_attribute("data-findings", "C001")
        expect(page.locator('#top-apps tr[data-app="reports"] td.findings')).to_have_text("C001 short-lived-connections")

    # Pool.
    pool = page.locator("#pool")
    expect(pool).to_have_attribute("data-mode", re.compile(r"^(pooled|passthrough)$"), timeout=WAIT_MS)
    want_pool = env("EXPECT_POOL_MODE", target.get("pool"))
    if want_pool:
        expect(pool).to_have_attribute("data-mode", want_pool)
    mode = pool.get_attribute("data-mode")
    if mode == "passthrough":
        expect(page.locator("#pool-passthrough")).to_contain_text("Passthrough")
    else:
        expect(page.locator("#pool-table tbody tr[data-server]").first).to_be_attached()
        if not target.get("real"):
            expect(page.locator("#pool-table tbody tr[data-server]")).to_have_count(3)
            expect(page.locator('#pool-pinned [data-reason="cursor"]')).to_contain_text("5")
    expect(page.locator("#pool-pinned [data-reason]")).to_have_count(4)

    # Shapes.
    shapes = page.locator("#shapes tbody tr[data-count]")
    min_shapes = int(os.environ.get("EXPECT_MIN_SHAPES") or 1)
    expect(shapes.nth(min_shapes - 1)).to_be_attached(timeout=WAIT_MS)
    assert shapes.count() <= 10
    if not target.get("real"):
        assert shapes.count() == 8
        expect(shapes.first).to_contain_text("analytics.events")  # most total time first
        expect(shapes.first).to_contain_text("aggregate")
        expect(shapes.first).to_contain_text("250.0 ms")  # p99 250000 µs

    # Nothing sticks out of the page sideways (wide tables scroll inside their cards).
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "horizontal overflow"

    # No error banner, no page errors.
    expect(page.locator("#error-banner")).to_be_hidden()
    assert page.errors == [], page.errors
    # Also nothing refused by the CSP. (Failed loads are left out: an HTTP error shows in the
    # banner, checked above, and /readyz answers 503 when the upstream is down.)
    console = [m for m in page.console_errors if not m.startswith("Failed to load resource")]
    assert console == [], console

    # One refresh cycle (2 s): "last updated" changes.
    last = page.locator("#last-updated")
    expect(last).not_to_have_attribute("data-updated", "", timeout=WAIT_MS)
    before = last.get_attribute("data-updated")
    before_text = last.text_content()
    expect(last).not_to_have_attribute("data-updated", before, timeout=6_000)
    assert int(last.get_attribute("data-updated")) - int(before) >= 1500
    # the clock shows seconds, so a ≥ 1.5 s step changes the text too (barring a 60 s wrap)
    assert last.text_content() != before_text or int(last.get_attribute("data-updated")) - int(before) > 50_000

    # Every request stayed on the admin listener's origin (self-contained page).
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(target["url"]))
    foreign = [u for u in page.requests if not u.startswith(origin + "/")]
    assert foreign == [], f"requests outside {origin}: {foreign}"

    # The screenshot: status-page.png for the real server or the pooled mock; the other mock
    # flavour gets its own file.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    cid = request.node.callspec.id
    name = "status-page.png" if cid in ("real", "mock-pooled-token") else f"status-page-{cid}.png"
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _mock_only():
    if REAL_URL:
        pytest.skip("mock-only check (MONGOGUARD_ADMIN_URL is set)")


def test_missing_token_shows_banner_not_blank(page):
    _mock_only()
    mock = MockServer("--token", MOCK_TOKEN)
    try:
        open_page(page, mock.url, None)
        banner = page.locator("#error-banner")
        expect(banner).to_be_visible(timeout=WAIT_MS)
        expect(banner).to_contain_text("401")
        expect(banner).to_contain_text("/pool")
        expect(page.locator("h1")).to_have_text("mongoguard")
        expect(page.locator("#latest-violations")).to_be_visible()
        assert page.errors == [], page.errors
    finally:
        mock.stop()


def test_one_failing_endpoint_keeps_the_rest(page):
    _mock_only()
    mock = MockServer("--fail", "/shapes", "--unready")
    try:
        open_page(page, mock.url, None)
        banner = page.locator("#error-banner")
        expect(banner).to_be_visible(timeout=WAIT_MS)
        expect(banner).to_contain_text("/shapes")
        expect(banner).to_contain_text("500")
        expect(banner.locator("li")).to_have_count(1)
        expect(page.locator('#violations-by-rule [data-rule="W003"]')).to_have_count(1)
        # /readyz 503 is a state, not a failure
        expect(page.locator("#health")).to_have_attribute("data-status", "unready")
        expect(page.locator("#health")).to_have_attribute("title", re.compile("connection refused"))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-page-error.png"), full_page=False)
    finally:
        mock.stop()


def test_server_going_away_shows_banner(page):
    _mock_only()
    mock = MockServer()
    try:
        open_page(page, mock.url, None)
        expect(page.locator('#violations-by-rule [data-rule="W003"]')).to_have_count(1, timeout=WAIT_MS)
    finally:
        mock.stop()
    banner = page.locator("#error-banner")
    expect(banner).to_be_visible(timeout=WAIT_MS)
    expect(banner).to_contain_text("network error")
    # last good data stays on screen
    expect(page.locator('#violations-by-rule [data-rule="W003"]')).to_have_count(1)


def test_client_text_is_escaped(page):
    _mock_only()
    mock = MockServer("--hostile")
    try:
        open_page(page, mock.url, None)
        hostile = page.locator("#top-apps tbody tr").filter(has_text="<img src=x")
        expect(hostile).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#latest-violations tbody tr").first).to_contain_text("<script>")
        assert page.locator("img").count() == 0
        assert page.locator("main script, main img").count() == 0
        page.wait_for_timeout(500)
        assert page.evaluate("window.__pwned") is None
        assert page.errors == [], page.errors
    finally:
        mock.stop()


def test_narrow_window_has_no_overflow(page):
    _mock_only()
    mock = MockServer()
    try:
        page.set_viewport_size({"width": 760, "height": 900})
        open_page(page, mock.url, None)
        expect(page.locator("#shapes tbody tr[data-count]").first).to_be_attached(timeout=WAIT_MS)
        expect(page.locator("#latest-violations tbody tr[data-rule]").first).to_be_attached()
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "horizontal overflow"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-page-narrow.png"), full_page=True)
    finally:
        mock.stop()
