#!/usr/bin/env bash
# Pooled mode with real drivers: mongoguard (proxy.mode = "pooled", pool_size 4) in front of
# mongoguard-standin with authentication on, on free loopback ports, without Docker.
#
#   1. PHP-FPM (Debian's php-fpm + php-mongodb, 50 static workers): 5,000 requests, 50 in
#      flight, each creating a new MongoDB\Driver\Manager, inserting and finding one document,
#      through mongoguard. Asserts: all succeed, every document is stored, and the stand-in saw
#      at most pool_size connections and authentications. Then the same run straight against
#      the stand-in: at least one connection and authentication per worker.
#   2. pytest integration/python/test_pooled.py (pymongo: serverless-style client churn,
#      cursors, w:0, transactions, policy blocks, auth failures, hello).
#
#   bash integration/run_pooled.sh [pytest args...]
#
# Environment:
#   CARGO_PROFILE       cargo profile to build and run (default: debug; e.g. release)
#   MONGOGUARD_BIN_DIR  use the mongoguard and mongoguard-standin binaries in this directory
#                       instead of building
#   MONGOGUARD_VENV     virtualenv to use or create (default: integration/.venv)
#   POOL_SIZE           mongoguard's [pool] pool_size (default 4)
#   PHP_REQUESTS        requests per PHP-FPM run (default 5000)
#   PHP_CONCURRENCY     requests in flight (default 50)
#   PHP_WORKERS         FPM static workers (default 50)
#   SKIP_PHP=1          skip the PHP-FPM scenario; SKIP_PYTEST=1 skips the pymongo suite
# Needs (installed with apt-get when missing and root): php-fpm php-cli php-mongodb libfcgi-bin.
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=integration/php/fpm.sh
source "$INTEGRATION_DIR/php/fpm.sh"

pool_size="${POOL_SIZE:-4}"
php_requests="${PHP_REQUESTS:-5000}"
php_concurrency="${PHP_CONCURRENCY:-50}"
php_workers="${PHP_WORKERS:-50}"

build_binaries

setup_python
if [ "${SKIP_PHP:-}" != 1 ]; then
    php_setup
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-pooled.XXXXXX")"
standin_pid=""
proxy_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    fpm_stop
    for pid in "$proxy_pid" "$standin_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
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
    log "---- mongoguard-standin log (tail) ----"
    tail -n 50 "$work/standin.log" >&2 || true
    log "---- mongoguard log (tail) ----"
    tail -n 80 "$work/mongoguard.log" >&2 || true
    fpm_logs
}

fail() {
    log "FAIL: $*"
    show_logs
    exit 1
}

# ---- stand-in, with authentication (the upstream identity mongoguard pools) --------------
upstream_user=app
upstream_password="apppw-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
standin_port="$(free_port)"
standin_addr="127.0.0.1:$standin_port"
"$bin_dir/mongoguard-standin" --listen "$standin_addr" \
    --user "$upstream_user:$upstream_password" >"$work/standin.log" 2>&1 &
standin_pid=$!
ready=""
for ((i = 0; i < 120; i++)); do
    if grep -q "listening on" "$work/standin.log" 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 "$standin_pid" 2>/dev/null || break
    sleep 0.5
done
[ -n "$ready" ] || fail "mongoguard-standin did not come up"
log "mongoguard-standin on $standin_addr (pid $standin_pid)"
direct_uri="mongodb://$upstream_user:$upstream_password@$standin_addr/?authSource=admin"

stats() {
    # stats [--reset]: the stand-in's counters as JSON (one fresh connection, which counts).
    "$PY" "$INTEGRATION_DIR/php/check.py" stats "$standin_addr" "$@"
}
jget() {
    # jget JSON KEY[.KEY]: one field of a JSON object (0 when absent).
    python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    v = v.get(k, 0) if isinstance(v, dict) else 0
print(v)' "$1" "$2"
}
stats >/dev/null || fail "the stand-in does not answer {standinStats: 1}"

# ---- mongoguard, pooled ----------------------------------------------------------------
client_user=phpapp
client_password="cli-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$client_password" |
    "$bin_dir/mongoguard" users add --file "$work/users.toml" "$client_user" ||
    fail "mongoguard users add failed"
proxy_port="$(free_port)"
cat >"$work/mongoguard.toml" <<TOML
[proxy]
listen = "127.0.0.1:$proxy_port"
mode = "pooled"

[upstream]
uri = "$direct_uri"

[pool]
pool_size = $pool_size
min_idle = 0
checkout_timeout = "5s"

[auth]
users_file = "$work/users.toml"

# This suite counts upstream connections and authentications against pool_size: the plan
# guard's own explain connection would be one more (it has its own tests).
[plan]
enabled = "off"
TOML
"$bin_dir/mongoguard" --admin-listen off --config "$work/mongoguard.toml" >"$work/mongoguard.log" 2>&1 &
proxy_pid=$!
if ! wait_tcp 127.0.0.1 "$proxy_port" 120 || ! kill -0 "$proxy_pid" 2>/dev/null; then
    fail "mongoguard (pooled) did not come up"
fi
log "mongoguard (pooled, pool_size $pool_size) on 127.0.0.1:$proxy_port (pid $proxy_pid)"
proxy_uri="mongodb://$client_user:$client_password@127.0.0.1:$proxy_port/?authSource=admin"

summary=()

# ---- 1. PHP-FPM ------------------------------------------------------------------------
if [ "${SKIP_PHP:-}" != 1 ]; then
    fpm_start "$work" "$php_workers" || fail "php-fpm did not start"

    # a. through mongoguard
    stats --reset >/dev/null
    run="pooled-$$"
    fpm_load "$proxy_uri" "$run" "$php_requests" "$php_concurrency" "$work/php-pooled.jsonl" ||
        fail "PHP-FPM through mongoguard: $FPM_LOAD_OK/$php_requests requests succeeded"
    pooled_seconds="$FPM_LOAD_SECONDS" pooled_pids="$FPM_LOAD_PIDS"
    s="$(stats)"
    pooled_conns=$(($(jget "$s" connectionsAccepted) - 1)) # minus this stats connection
    pooled_auths="$(jget "$s" authentications)"
    pooled_open=$(($(jget "$s" connectionsOpen) - 1))
    pooled_inserts="$(jget "$s" commands.insert)" pooled_finds="$(jget "$s" commands.find)"
    "$PY" "$INTEGRATION_DIR/php/check.py" count "$direct_uri" phpfpm hits "$run" "$php_requests" ||
        fail "PHP-FPM through mongoguard: documents missing upstream"
    line="PHP-FPM via mongoguard (pooled, pool_size $pool_size): $php_requests/$php_requests ok"
    line+=" in ${pooled_seconds}s, $pooled_pids workers; upstream connections accepted $pooled_conns,"
    line+=" authentications $pooled_auths, open now $pooled_open (insert $pooled_inserts, find $pooled_finds)"
    summary+=("$line")
    log "$line"
    [ "$pooled_conns" -le "$pool_size" ] ||
        fail "pooled: $pooled_conns upstream connections > pool_size $pool_size"
    [ "$pooled_auths" -le "$pool_size" ] ||
        fail "pooled: $pooled_auths upstream authentications > pool_size $pool_size"

    # b. the same, straight to the stand-in
    stats --reset >/dev/null
    run="direct-$$"
    fpm_load "$direct_uri" "$run" "$php_requests" "$php_concurrency" "$work/php-direct.jsonl" ||
        fail "PHP-FPM straight to the stand-in: $FPM_LOAD_OK/$php_requests requests succeeded"
    direct_seconds="$FPM_LOAD_SECONDS" direct_pids="$FPM_LOAD_PIDS"
    s="$(stats)"
    direct_conns=$(($(jget "$s" connectionsAccepted) - 1))
    direct_auths="$(jget "$s" authentications)"
    direct_open=$(($(jget "$s" connectionsOpen) - 1))
    "$PY" "$INTEGRATION_DIR/php/check.py" count "$direct_uri" phpfpm hits "$run" "$php_requests" ||
        fail "PHP-FPM straight to the stand-in: documents missing"
    line="PHP-FPM direct to the stand-in: $php_requests/$php_requests ok in ${direct_seconds}s,"
    line+=" $direct_pids workers; upstream connections accepted $direct_conns, authentications $direct_auths, open now $direct_open"
    summary+=("$line")
    log "$line"
    # ext-mongodb keeps one client per worker and URI: at least one connection and one
    # authentication per worker that served a request.
    if [ "$direct_conns" -lt "$direct_pids" ] || [ "$direct_auths" -lt "$direct_pids" ]; then
        fail "direct: expected >= $direct_pids connections and authentications (one per worker)"
    fi
    if [ "$direct_pids" -lt "$php_workers" ]; then
        log "note: only $direct_pids of $php_workers workers served a request in the direct run"
    fi
    fpm_stop
fi

# ---- 2. pymongo ------------------------------------------------------------------------
status=0
if [ "${SKIP_PYTEST:-}" != 1 ]; then
    MONGOGUARD_POOLED_ADDR="127.0.0.1:$proxy_port" \
        MONGOGUARD_POOLED_USER="$client_user" \
        MONGOGUARD_POOLED_PASSWORD="$client_password" \
        MONGOGUARD_STANDIN_ADDR="$standin_addr" \
        MONGOGUARD_STANDIN_URI="$direct_uri" \
        MONGOGUARD_POOL_SIZE="$pool_size" \
        "$PY" -m pytest -p no:cacheprovider -v -rsP "$INTEGRATION_DIR/python/test_pooled.py" "$@" ||
        status=$?
fi

if [ "$status" != 0 ]; then
    show_logs
fi
log "==== summary ===="
for line in "${summary[@]}"; do
    log "$line"
done
if [ "${SKIP_PYTEST:-}" = 1 ]; then
    log "pytest test_pooled.py: skipped (SKIP_PYTEST=1)"
elif [ "$status" = 0 ]; then
    log "pytest test_pooled.py: passed"
else
    log "pytest test_pooled.py: exit $status"
fi
exit "$status"
