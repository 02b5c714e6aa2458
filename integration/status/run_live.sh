#!/usr/bin/env bash
# The status page of a real mongoguard, in headless Chromium, while traffic flows: starts the
# stand-in (with a user) and mongoguard in pooled mode with its admin listener (bearer token),
# runs pymongo traffic from two applications (allowed commands and W003 blocks) before and
# during the browser test, then runs integration/status/test_status_page.py against it. The
# screenshot is kept in $ARTIFACTS_DIR/status-page.png (default target/artifacts).
#
#   bash integration/status/run_live.sh
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

build_binaries
setup_python

work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-status.XXXXXX")"
pids=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

standin_port="$(free_port)"
"$bin_dir/mongoguard-standin" --listen "127.0.0.1:$standin_port" --user app:apppw \
    >"$work/standin.log" 2>&1 &
pids+=($!)
wait_tcp 127.0.0.1 "$standin_port" 120 || { log "stand-in did not come up"; exit 1; }

printf '%s' 'webpw' | "$bin_dir/mongoguard" users add --file "$work/users.toml" web >/dev/null
token="status-test-$RANDOM$RANDOM"
printf '%s\n' "$token" >"$work/admin.token"
proxy_port="$(free_port)"
admin_port="$(free_port)"
cat >"$work/mongoguard.toml" <<TOML
[proxy]
listen = "127.0.0.1:$proxy_port"
mode = "pooled"
[upstream]
uri = "mongodb://app:apppw@127.0.0.1:$standin_port/?authSource=admin"
[pool]
pool_size = 4
[auth]
users_file = "$work/users.toml"
[admin]
listen = "127.0.0.1:$admin_port"
token_file = "$work/admin.token"
[audit]
sink = "none"
TOML
"$bin_dir/mongoguard" --config "$work/mongoguard.toml" >"$work/mongoguard.log" 2>&1 &
pids+=($!)
if ! wait_tcp 127.0.0.1 "$admin_port" 120 || ! wait_tcp 127.0.0.1 "$proxy_port" 20; then
    log "mongoguard did not come up"
    tail -n 40 "$work/mongoguard.log" >&2 || true
    exit 1
fi
uri="mongodb://web:webpw@127.0.0.1:$proxy_port/?authSource=admin"
# Some history first (so every section has data), then traffic while the browser looks.
"$PY" "$INTEGRATION_DIR/status/traffic.py" --uri "$uri" --once
"$PY" "$INTEGRATION_DIR/status/traffic.py" --uri "$uri" --seconds 600 >"$work/traffic.log" 2>&1 &
pids+=($!)

status=0
MONGOGUARD_ADMIN_URL="http://127.0.0.1:$admin_port/" MONGOGUARD_ADMIN_TOKEN="$token" \
    EXPECT_RULE=W003 EXPECT_POLICY_MODE=enforce EXPECT_POOL_MODE=pooled \
    bash "$INTEGRATION_DIR/status/run.sh" "$@" || status=$?
if [ "$status" != 0 ]; then
    log "---- mongoguard log (tail) ----"
    tail -n 60 "$work/mongoguard.log" >&2 || true
    log "---- traffic log ----"
    cat "$work/traffic.log" >&2 || true
fi
exit "$status"
