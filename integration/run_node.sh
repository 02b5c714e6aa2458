#!/usr/bin/env bash
# Runs the Node.js driver suite (integration/node: the official `mongodb` npm package, node:test)
# against mongoguard in front of mongoguard-standin, on free loopback ports, without Docker and
# without a real mongod. Exits with node --test's status.
#
#   bash integration/run_node.sh [extra node --test options, e.g. --test-reporter=tap]
#
# It starts:
#   1. a stand-in without users + mongoguard in passthrough mode (test/drivers.test.mjs and
#      test/guard.test.mjs);
#   2. a stand-in with a user + mongoguard in pooled mode (pool_size $POOL_SIZE, a users file
#      made with `mongoguard users add`) (test/pooled.test.mjs).
#
# Environment:
#   CARGO_PROFILE       cargo profile to build and run (default: debug; e.g. release)
#   CARGO_TARGET_DIR    honoured (through cargo metadata)
#   MONGOGUARD_BIN_DIR  use the mongoguard and mongoguard-standin binaries in this directory
#                       instead of building
#   POOL_SIZE           the pooled mongoguard's [pool] pool_size (default 4)
#   CI=true             a suite whose environment is missing fails instead of skipping
# Needs node >= 20 and npm (`npm ci` installs integration/node/package-lock.json).
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODE_DIR="$INTEGRATION_DIR/node"
pool_size="${POOL_SIZE:-4}"

command -v node >/dev/null 2>&1 || {
    log "node is not installed (Node.js >= 20 is needed)"
    exit 1
}
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
    log "node $(node --version) is too old: the suite needs Node.js >= 20 (node:test)"
    exit 1
fi

# ---- dependencies: npm ci, skipped while package-lock.json is unchanged -------------------
lock_sum="$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)"
stamp="$NODE_DIR/node_modules/.mongoguard-lock.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
    log "npm ci in $NODE_DIR"
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$lock_sum" >"$stamp"
fi
log "node $(node --version), mongodb driver $(node -p "require('$NODE_DIR/node_modules/mongodb/package.json').version")"

# ---- binaries --------------------------------------------------------------------------
build_binaries

work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-node.XXXXXX")"
pids=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_logs() {
    local name
    for name in standin mongoguard standin-pooled mongoguard-pooled; do
        if [ -f "$work/$name.log" ]; then
            log "---- $name log (tail) ----"
            tail -n 60 "$work/$name.log" >&2 || true
        fi
    done
}

fail() {
    log "FAIL: $*"
    show_logs
    exit 1
}

# start_standin NAME [ARGS...]: starts a stand-in logging to $work/NAME.log; sets $STANDIN_ADDR.
start_standin() {
    local name="$1" port i pid
    shift
    port="$(free_port)"
    "$bin_dir/mongoguard-standin" --listen "127.0.0.1:$port" "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for ((i = 0; i < 120; i++)); do
        if grep -q "listening on" "$work/$name.log" 2>/dev/null; then
            STANDIN_ADDR="127.0.0.1:$port"
            log "$name on $STANDIN_ADDR (pid $pid)"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    fail "$name did not come up"
}

# start_mongoguard NAME PORT ARGS...: starts mongoguard logging to $work/NAME.log.
start_mongoguard() {
    local name="$1" port="$2" pid
    shift 2
    "$bin_dir/mongoguard" --admin-listen off "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    if ! wait_tcp 127.0.0.1 "$port" 120 || ! kill -0 "$pid" 2>/dev/null; then
        fail "$name did not come up"
    fi
    log "$name on 127.0.0.1:$port (pid $pid)"
}

# ---- 1. passthrough ----------------------------------------------------------------------
start_standin standin
plain_addr="$STANDIN_ADDR"
proxy_port="$(free_port)"
start_mongoguard mongoguard "$proxy_port" --listen "127.0.0.1:$proxy_port" \
    --upstream "mongodb://$plain_addr"

# ---- 2. pooled -------------------------------------------------------------------------
upstream_user=app
upstream_password=apppw
start_standin standin-pooled --user "$upstream_user:$upstream_password"
pooled_standin_addr="$STANDIN_ADDR"
pooled_standin_uri="mongodb://$upstream_user:$upstream_password@$pooled_standin_addr/?authSource=admin"

client_user=nodeuser
client_password="node-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s' "$client_password" |
    "$bin_dir/mongoguard" users add --file "$work/users.toml" "$client_user" >/dev/null ||
    fail "mongoguard users add failed"
pooled_port="$(free_port)"
cat >"$work/mongoguard-pooled.toml" <<TOML
[proxy]
listen = "127.0.0.1:$pooled_port"
mode = "pooled"

[upstream]
uri = "$pooled_standin_uri"

[pool]
pool_size = $pool_size
min_idle = 0
checkout_timeout = "5s"

[auth]
users_file = "$work/users.toml"

[audit]
sink = "none"
TOML
start_mongoguard mongoguard-pooled "$pooled_port" --config "$work/mongoguard-pooled.toml"

# ---- node --test -------------------------------------------------------------------------
status=0
(
    cd "$REPO_DIR"
    MONGOGUARD_PROXY_URI="mongodb://127.0.0.1:$proxy_port" \
        MONGOGUARD_DIRECT_URI="mongodb://$plain_addr" \
        MONGOGUARD_POOLED_ADDR="127.0.0.1:$pooled_port" \
        MONGOGUARD_POOLED_USER="$client_user" \
        MONGOGUARD_POOLED_PASSWORD="$client_password" \
        MONGOGUARD_STANDIN_ADDR="$pooled_standin_addr" \
        MONGOGUARD_STANDIN_URI="$pooled_standin_uri" \
        MONGOGUARD_POOL_SIZE="$pool_size" \
        node --test --test-reporter=spec "$@" integration/node/test/
) || status=$?

if [ "$status" != 0 ]; then
    show_logs
fi
log "node --test: exit $status"
exit "$status"
