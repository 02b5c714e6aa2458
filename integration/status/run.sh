#!/usr/bin/env bash
# The status page (src/admin/status.html) in a real headless Chromium (Playwright for Python
# driving Debian's chromium). Without MONGOGUARD_ADMIN_URL the test starts its own mock admin
# server (integration/status/mock_admin.py); with it, the page of a running mongoguard admin
# listener is checked instead. Exits with pytest's status.
#
#   bash integration/status/run.sh [pytest args...]
#   MONGOGUARD_ADMIN_URL=http://127.0.0.1:9216/ EXPECT_RULE=W003 bash integration/status/run.sh
#
# Installs what it needs: chromium with apt-get (as root) when $CHROMIUM is missing, and
# integration/status/requirements.txt into the integration virtualenv (see common.sh).
#
# Environment (more in the test's docstring):
#   MONGOGUARD_ADMIN_URL, MONGOGUARD_ADMIN_TOKEN   a real admin listener and its token
#   EXPECT_RULE, EXPECT_RULE_COUNT, EXPECT_POLICY_MODE, EXPECT_POOL_MODE,
#   EXPECT_MIN_VIOLATIONS, EXPECT_MIN_SHAPES       expectations against a real server
#   ARTIFACTS_DIR    where status-page.png goes (default: target/artifacts in the repo)
#   CHROMIUM         browser binary (default /usr/bin/chromium)
#   MONGOGUARD_VENV  virtualenv to use or create (default: integration/.venv)
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

STATUS_DIR="$INTEGRATION_DIR/status"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
export CHROMIUM PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [ ! -x "$CHROMIUM" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing chromium with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
    else
        log "$CHROMIUM is missing: install Debian's chromium (apt-get install chromium) or set CHROMIUM"
        exit 2
    fi
fi
log "browser: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"

setup_python

status_req="$STATUS_DIR/requirements.txt"
status_stamp="$(dirname "$(dirname "$PY")")/.status-requirements.sha256"
want="$(sha256sum "$status_req" | cut -d' ' -f1)"
if [ "$(cat "$status_stamp" 2>/dev/null)" != "$want" ] || ! "$PY" -c 'import playwright' 2>/dev/null; then
    log "installing $status_req"
    if [ -w "$(dirname "$status_stamp")" ] && [ "$PY" != "$(command -v python3)" ]; then
        "$PY" -m pip install --disable-pip-version-check -q -r "$status_req"
        echo "$want" >"$status_stamp"
    else
        PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install --disable-pip-version-check -q --user -r "$status_req"
    fi
fi

export ARTIFACTS_DIR="${ARTIFACTS_DIR:-$REPO_DIR/target/artifacts}"
mkdir -p "$ARTIFACTS_DIR"
if [ -n "${MONGOGUARD_ADMIN_URL:-}" ]; then
    log "testing the status page of $MONGOGUARD_ADMIN_URL"
else
    log "testing the status page against the mock admin server"
fi
cd "$REPO_DIR"
status=0
"$PY" -m pytest -p no:cacheprovider -v "$STATUS_DIR/test_status_page.py" "$@" || status=$?
if [ -f "$ARTIFACTS_DIR/status-page.png" ]; then
    log "screenshot: $ARTIFACTS_DIR/status-page.png"
fi
exit "$status"
