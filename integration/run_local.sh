#!/usr/bin/env bash
# Runs the pymongo suite against mongoguard in front of mongoguard-standin, on free loopback
# ports, without Docker and without a real mongod. Exits with pytest's status.
#
#   bash integration/run_local.sh [pytest args...]
#
# Environment:
#   CARGO_PROFILE   cargo profile to build and run (default: debug; e.g. release)
#   MONGOGUARD_VENV virtualenv to use or create (default: integration/.venv)
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_binaries

setup_python

work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-it.XXXXXX")"
standin_pid=""
proxy_pid=""
tls_pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    for pid in "$tls_pid" "$proxy_pid" "$standin_pid"; do
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
}

# The stand-in announces "mongoguard-standin listening on 127.0.0.1:PORT" on stdout when ready.
standin_port="$(free_port)"
"$bin_dir/mongoguard-standin" --listen "127.0.0.1:$standin_port" >"$work/standin.log" 2>&1 &
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
if [ -z "$ready" ]; then
    log "mongoguard-standin did not come up"
    show_logs
    exit 1
fi
log "mongoguard-standin on 127.0.0.1:$standin_port (pid $standin_pid)"

proxy_port="$(free_port)"
"$bin_dir/mongoguard" --admin-listen off --listen "127.0.0.1:$proxy_port" \
    --upstream "mongodb://127.0.0.1:$standin_port" >"$work/mongoguard.log" 2>&1 &
proxy_pid=$!
if ! wait_tcp 127.0.0.1 "$proxy_port" 120 || ! kill -0 "$proxy_pid" 2>/dev/null; then
    log "mongoguard did not come up"
    show_logs
    exit 1
fi
log "mongoguard on 127.0.0.1:$proxy_port (pid $proxy_pid)"

# A second mongoguard with a TLS listener, for test_tls.py: throwaway CA and server
# certificate (localhost and 127.0.0.1), plus an unrelated CA the client must not trust.
tls_dir="$work/tls"
mkdir -p "$tls_dir"
(
    cd "$tls_dir"
    for ca in ca other-ca; do
        openssl req -x509 -newkey rsa:2048 -nodes -keyout "$ca.key" -out "$ca.pem" -days 2 \
            -subj "/CN=mongoguard test $ca" >/dev/null 2>&1
    done
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
        -subj "/CN=localhost" >/dev/null 2>&1
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
        -out server.crt -days 2 -extfile server.ext >/dev/null 2>&1
)
tls_port="$(free_port)"
cat >"$tls_dir/mongoguard.toml" <<TOML
[proxy]
listen = "127.0.0.1:$tls_port"
[upstream]
uri = "mongodb://127.0.0.1:$standin_port"
[tls]
cert_file = "$tls_dir/server.crt"
key_file = "$tls_dir/server.key"
[audit]
sink = "none"
TOML
"$bin_dir/mongoguard" --admin-listen off --config "$tls_dir/mongoguard.toml" >"$work/mongoguard-tls.log" 2>&1 &
tls_pid=$!
if ! wait_tcp 127.0.0.1 "$tls_port" 120 || ! kill -0 "$tls_pid" 2>/dev/null; then
    log "mongoguard (TLS) did not come up"
    tail -n 40 "$work/mongoguard-tls.log" >&2 || true
    exit 1
fi
log "mongoguard with TLS on 127.0.0.1:$tls_port (pid $tls_pid)"

status=0
MONGOGUARD_PROXY_URI="mongodb://127.0.0.1:$proxy_port" \
    MONGOGUARD_DIRECT_URI="mongodb://127.0.0.1:$standin_port" \
    MONGOGUARD_TLS_PORT="$tls_port" \
    MONGOGUARD_TLS_CA="$tls_dir/ca.pem" \
    MONGOGUARD_TLS_OTHER_CA="$tls_dir/other-ca.pem" \
    "$PY" -m pytest -p no:cacheprovider -v -rs "$INTEGRATION_DIR/python" "$@" || status=$?

if [ "$status" != 0 ]; then
    show_logs
else
    # The learned allowlist's workflow: learn, review, enforce (mongoguard restarted between).
    MONGOGUARD_BIN_DIR="$bin_dir" bash "$INTEGRATION_DIR/run_allowlist.sh" || status=$?
fi
exit "$status"
