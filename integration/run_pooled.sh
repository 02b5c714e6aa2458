#!/usr/bin/env bash
# Pooled mode with real drivers: mongoguard (proxy.mode = "pooled", pool_size 4) in front of
# mongoguard-standin with authentication on, on free loopback ports, without Docker.
#
#   1. PHP-FPM (Debian's php-fpm + php-mongodb, 50 static workers): 5,000 requests, 50 in
#      flight, each creating a new MongoDB\Driver\Manager, inserting and finding one document,
#      through mongoguard. Asserts: all succeed, every document is stored, and the stand-in saw
#      at most pool_size connections and authentications. Then the same run straight against
#      the stand-in: at least one connection and authentication per worker.
#      Then (unless SKIP_SHARDED=1) a sharded pool: a second pooled mongoguard with pool_size 8
#      and [proxy] threads = 2 (two session threads, a pool shard of 4 each, where a released
#      connection carries the next waiting client's request: send-ahead), its admin listener
#      on, in front of a stand-in of its own; 2,000 requests through it. Asserts: all succeed,
#      each reads back its own document, at most pool_size upstream connections open at once
#      (the stand-in's connectionsOpenMax), at most pool_size + slots moved between the shards
#      connections and authentications in all (a moved slot closes one and opens one), and
#      mongoguard_pool_requests_sent_ahead_total (its /metrics) above 0.
#   2. pytest integration/python/test_pooled.py (pymongo: serverless-style client churn,
#      cursors, w:0, transactions, policy blocks, auth failures, hello), against the pool_size
#      4 mongoguard and then (unless SKIP_SHARDED=1) against the sharded one.
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
#   SHARDED_POOL_SIZE   the sharded mongoguard's pool_size (default 8; 4 cannot shard, and
#                       the sent-ahead check then fails: how to see that it can)
#   SHARDED_REQUESTS    requests of the PHP-FPM run through it (default 2000)
#   SKIP_PHP=1          skip the PHP-FPM scenario; SKIP_PYTEST=1 skips the pymongo suite;
#   SKIP_SHARDED=1      skips everything against the sharded mongoguard
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
sharded_pool_size="${SHARDED_POOL_SIZE:-8}"
sharded_requests="${SHARDED_REQUESTS:-2000}"

build_binaries

setup_python
if [ "${SKIP_PHP:-}" != 1 ]; then
    php_setup
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-pooled.XXXXXX")"
standin_pid=""
proxy_pid=""
sharded_standin_pid=""
sharded_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    fpm_stop
    for pid in "$sharded_pid" "$sharded_standin_pid" "$proxy_pid" "$standin_pid"; do
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
    if [ -s "$work/mongoguard-sharded.log" ]; then
        log "---- mongoguard-standin (sharded pool's) log (tail) ----"
        tail -n 50 "$work/standin-sharded.log" >&2 || true
        log "---- mongoguard (sharded pool) log (tail) ----"
        tail -n 80 "$work/mongoguard-sharded.log" >&2 || true
    fi
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
# start_standin LOG: a stand-in requiring the upstream user, logging to $work/LOG; sets
# started_addr and started_pid.
start_standin() {
    local port i
    port="$(free_port)"
    started_addr="127.0.0.1:$port"
    "$bin_dir/mongoguard-standin" --listen "$started_addr" \
        --user "$upstream_user:$upstream_password" >"$work/$1" 2>&1 &
    started_pid=$!
    for ((i = 0; i < 120; i++)); do
        if grep -q "listening on" "$work/$1" 2>/dev/null; then
            log "mongoguard-standin on $started_addr (pid $started_pid)"
            return 0
        fi
        kill -0 "$started_pid" 2>/dev/null || break
        sleep 0.5
    done
    return 1
}
start_standin standin.log || { standin_pid="$started_pid"; fail "mongoguard-standin did not come up"; }
standin_addr="$started_addr" standin_pid="$started_pid"
direct_uri="mongodb://$upstream_user:$upstream_password@$standin_addr/?authSource=admin"

stats() {
    # stats [--reset]: the stand-in's counters as JSON (one fresh connection, which counts).
    "$PY" "$INTEGRATION_DIR/php/check.py" stats "$standin_addr" "$@"
}
sharded_stats() {
    # sharded_stats [--reset]: the same for the sharded mongoguard's stand-in.
    "$PY" "$INTEGRATION_DIR/php/check.py" stats "$sharded_standin_addr" "$@"
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
# pooled_toml FILE PORT UPSTREAM_URI POOL_SIZE [PROXY_LINES]: a pooled mongoguard's config.
pooled_toml() {
    cat >"$1" <<TOML
[proxy]
listen = "127.0.0.1:$2"
mode = "pooled"
${5:-}

[upstream]
uri = "$3"

[pool]
pool_size = $4
min_idle = 0
checkout_timeout = "5s"

[auth]
users_file = "$work/users.toml"

# This suite counts upstream connections and authentications against pool_size: the plan
# guard's own explain connection would be one more (it has its own tests).
[plan]
enabled = "off"
TOML
}
proxy_port="$(free_port)"
pooled_toml "$work/mongoguard.toml" "$proxy_port" "$direct_uri" "$pool_size"
"$bin_dir/mongoguard" --admin-listen off --config "$work/mongoguard.toml" >"$work/mongoguard.log" 2>&1 &
proxy_pid=$!
if ! wait_tcp 127.0.0.1 "$proxy_port" 120 || ! kill -0 "$proxy_pid" 2>/dev/null; then
    fail "mongoguard (pooled) did not come up"
fi
log "mongoguard (pooled, pool_size $pool_size) on 127.0.0.1:$proxy_port (pid $proxy_pid)"
proxy_uri="mongodb://$client_user:$client_password@127.0.0.1:$proxy_port/?authSource=admin"

# ---- mongoguard, pooled, with a sharded pool (send-ahead) -------------------------------
# Two session threads, each with its own shard of the pool (pool_size / 2 >= 4 connections
# and checkout_timeout >= 500 ms, or pooled mode runs unsharded: src/proxy/loops.rs
# pooled_threads); only there does a released connection carry the next waiting client's
# request (mongoguard_pool_requests_sent_ahead_total). Its admin listener serves /metrics.
# It has a stand-in of its own: the most connections open there at once is its pool's.
if [ "${SKIP_SHARDED:-}" != 1 ]; then
    start_standin standin-sharded.log || {
        sharded_standin_pid="$started_pid"
        fail "mongoguard-standin (sharded pool's) did not come up"
    }
    sharded_standin_addr="$started_addr" sharded_standin_pid="$started_pid"
    sharded_direct_uri="mongodb://$upstream_user:$upstream_password@$sharded_standin_addr/?authSource=admin"
    sharded_port="$(free_port)"
    sharded_admin="127.0.0.1:$(free_port)"
    pooled_toml "$work/mongoguard-sharded.toml" "$sharded_port" "$sharded_direct_uri" \
        "$sharded_pool_size" "threads = 2"
    "$bin_dir/mongoguard" --admin-listen "$sharded_admin" --config "$work/mongoguard-sharded.toml" \
        >"$work/mongoguard-sharded.log" 2>&1 &
    sharded_pid=$!
    if ! wait_tcp 127.0.0.1 "$sharded_port" 120 || ! kill -0 "$sharded_pid" 2>/dev/null; then
        fail "mongoguard (pooled, sharded) did not come up"
    fi
    # "mongoguard listening ... threads=N": N session threads (0: the shared runtime, unsharded).
    sharded_threads="$(sed -n 's/.*mongoguard listening.*threads=\([0-9]*\).*/\1/p' \
        "$work/mongoguard-sharded.log" | head -n 1)"
    log "mongoguard (pooled, pool_size $sharded_pool_size, session threads ${sharded_threads:-?})" \
        "on 127.0.0.1:$sharded_port (pid $sharded_pid), admin on $sharded_admin"
    sharded_uri="mongodb://$client_user:$client_password@127.0.0.1:$sharded_port/?authSource=admin"
fi
# metric NAME: the sum of NAME's samples on the sharded mongoguard's /metrics.
metric() {
    local text
    if ! text="$(curl -sf "http://$sharded_admin/metrics")"; then
        log "GET http://$sharded_admin/metrics failed"
        return 1
    fi
    printf '%s\n' "$text" | awk -v name="$1" '$1 == name || index($1, name "{") == 1 {s += $NF} END {print s + 0}'
}

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

    # c. through the sharded mongoguard: send-ahead under a real driver
    if [ "${SKIP_SHARDED:-}" != 1 ]; then
        sharded_stats --reset >/dev/null
        run="sharded-$$"
        fpm_load "$sharded_uri" "$run" "$sharded_requests" "$php_concurrency" \
            "$work/php-sharded.jsonl" ||
            fail "PHP-FPM through the sharded mongoguard: $FPM_LOAD_OK/$sharded_requests requests succeeded"
        sharded_seconds="$FPM_LOAD_SECONDS" sharded_pids="$FPM_LOAD_PIDS"
        s="$(sharded_stats)"
        # minus this stats connection (the most open at once: the one open at the reset, or
        # this one, is not the pool's)
        sharded_conns=$(($(jget "$s" connectionsAccepted) - 1))
        sharded_peak=$(($(jget "$s" connectionsOpenMax) - 1))
        sharded_auths="$(jget "$s" authentications)"
        "$PY" "$INTEGRATION_DIR/php/check.py" count "$sharded_direct_uri" phpfpm hits "$run" \
            "$sharded_requests" || fail "PHP-FPM through the sharded mongoguard: documents missing upstream"
        sent_ahead="$(metric mongoguard_pool_requests_sent_ahead_total)" ||
            fail "cannot read the sharded mongoguard's metrics"
        moved="$(metric mongoguard_pool_slots_moved_total)" ||
            fail "cannot read the sharded mongoguard's metrics"
        timeouts="$(metric mongoguard_pool_checkout_timeouts_total)" ||
            fail "cannot read the sharded mongoguard's metrics"
        line="PHP-FPM via mongoguard (pooled, pool_size $sharded_pool_size, session threads"
        line+=" ${sharded_threads:-?}): $sharded_requests/$sharded_requests ok in ${sharded_seconds}s,"
        line+=" $sharded_pids workers; upstream connections at most $sharded_peak open at once,"
        line+=" $sharded_conns accepted, authentications $sharded_auths; requests sent ahead"
        line+=" $sent_ahead, slots moved between shards $moved, checkout timeouts $timeouts"
        summary+=("$line")
        log "$line"
        # The shards' limits add up to pool_size: never more open at once. A slot moved from
        # one shard to the other closes at most one connection and opens at most one, so
        # more can be opened (and authenticated) in all, but not more than pool_size + moves.
        [ "$sharded_peak" -le "$sharded_pool_size" ] ||
            fail "sharded: $sharded_peak upstream connections open at once > pool_size $sharded_pool_size"
        [ "$sharded_conns" -le $((sharded_pool_size + moved)) ] ||
            fail "sharded: $sharded_conns upstream connections > pool_size $sharded_pool_size + $moved moved slots"
        [ "$sharded_auths" -le $((sharded_pool_size + moved)) ] ||
            fail "sharded: $sharded_auths upstream authentications > pool_size $sharded_pool_size + $moved moved slots"
        [ "$sent_ahead" -gt 0 ] ||
            fail "sharded: mongoguard_pool_requests_sent_ahead_total is 0: no request was sent" \
                "ahead (session threads: ${sharded_threads:-?}; the pool shards only with" \
                "pool_size >= 8 and 2+ threads)"
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
    if [ "$status" = 0 ] && [ "${SKIP_SHARDED:-}" != 1 ]; then
        log "pytest test_pooled.py against the sharded mongoguard (pool_size $sharded_pool_size)"
        MONGOGUARD_POOLED_ADDR="127.0.0.1:$sharded_port" \
            MONGOGUARD_POOLED_USER="$client_user" \
            MONGOGUARD_POOLED_PASSWORD="$client_password" \
            MONGOGUARD_STANDIN_ADDR="$sharded_standin_addr" \
            MONGOGUARD_STANDIN_URI="$sharded_direct_uri" \
            MONGOGUARD_POOL_SIZE="$sharded_pool_size" \
            MONGOGUARD_POOLED_ADMIN="$sharded_admin" \
            "$PY" -m pytest -p no:cacheprovider -q -rs "$INTEGRATION_DIR/python/test_pooled.py" "$@" ||
            status=$?
        line="pytest test_pooled.py against the sharded mongoguard: exit $status; requests sent"
        ahead="$(metric mongoguard_pool_requests_sent_ahead_total || echo '?')"
        line+=" ahead in all (PHP-FPM and pymongo): $ahead"
        summary+=("$line")
    fi
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
