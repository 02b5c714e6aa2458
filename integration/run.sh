#!/usr/bin/env bash
# Runs both driver suites against a REAL mongod 7.0 (single-node replica set rs0) through
# mongoguard, with Docker:
#
#   1. docker compose up (docker-compose.yml at the repo root): mongod on 127.0.0.1:27018,
#      mongoguard (built from the root Dockerfile) on 127.0.0.1:27017 in front of it;
#   2. the pymongo suite against the compose mongoguard, verifying through the compose mongod;
#   3. the Rust suite (tests/drivers_rust.rs), whose tests start their own in-process proxy in
#      front of the compose mongod (MONGOGUARD_TEST_UPSTREAM);
#   4. docker compose down.
#
#   bash integration/run.sh [pytest args...]
#
# Environment:
#   KEEP_COMPOSE=1   leave the compose services running afterwards
#   MONGOGUARD_VENV  virtualenv to use or create (default: integration/.venv)
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

compose=(docker compose -f "$REPO_DIR/docker-compose.yml")

if ! docker compose version >/dev/null 2>&1; then
    log "this needs Docker with the compose plugin ('docker compose'); use run_local.sh otherwise"
    exit 2
fi

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ "${KEEP_COMPOSE:-0}" != 1 ]; then
        log "docker compose down"
        "${compose[@]}" down -v --remove-orphans >&2 || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

setup_python

log "docker compose up (builds mongoguard, waits for mongod to be primary)"
if ! "${compose[@]}" up -d --build --wait --wait-timeout 600 mongod mongoguard; then
    "${compose[@]}" ps >&2 || true
    "${compose[@]}" logs --tail 100 >&2 || true
    exit 1
fi

proxy_uri="mongodb://127.0.0.1:27017"
# directConnection: the member advertises itself as mongod:27017, a name only the compose
# network resolves.
direct_uri="mongodb://127.0.0.1:27018/?directConnection=true"

py_status=0
log "pymongo suite: proxy $proxy_uri, direct $direct_uri"
MONGOGUARD_PROXY_URI="$proxy_uri" MONGOGUARD_DIRECT_URI="$direct_uri" \
    "$PY" -m pytest -p no:cacheprovider -v -rs "$INTEGRATION_DIR/python" "$@" || py_status=$?

rs_status=0
log "Rust suite: in-process proxy in front of $direct_uri"
# Checks that cannot run against a real mongod report themselves here (tests/support/mod.rs,
# `skipped`): counted and listed below, never silent passes.
skip_log="$(mktemp "${TMPDIR:-/tmp}/mongoguard-skips.XXXXXX")"
(cd "$REPO_DIR" && MONGOGUARD_TEST_UPSTREAM="$direct_uri" MONGOGUARD_SKIP_LOG="$skip_log" \
    cargo test -p mongoguard --test drivers_rust) || rs_status=$?
log "Rust suite: $(wc -l <"$skip_log") checks SKIPPED against the real mongod"
sed 's/^/    /' "$skip_log" >&2
rm -f "$skip_log"

if [ "$py_status" != 0 ] || [ "$rs_status" != 0 ]; then
    "${compose[@]}" logs --tail 100 mongoguard >&2 || true
fi
log "pymongo suite exit status $py_status, Rust suite exit status $rs_status"
if [ "$py_status" != 0 ]; then
    exit "$py_status"
fi
exit "$rs_status"
