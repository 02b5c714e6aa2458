#!/usr/bin/env bash
# Serverless with real drivers: every operation = construct a new client (pymongo
# `MongoClient(uri)`, Node.js `new MongoClient(uri)`), run one command that needs the upstream
# (`ping` on admin), close the client. Direct (through a delayrelay with TLS, standing in for a
# remote mongod) vs pooled (a local mongoguard in pooled mode, upstream through the same relay).
# The topology is run_pooled.sh's serverless part with UPSTREAM_DELAY_MS=1 UPSTREAM_TLS=1:
#
#   driver -> delayrelay (1 ms each way, +1 RTT per new connection, TLS) -> stand-in   (direct)
#   driver -> mongoguard pooled (loopback, plain) -> delayrelay -> stand-in             (pooled)
#
# The stand-in requires SCRAM (user APP_USER); the pooled mongoguard's users file has the same
# user and password (from `mongoguard users add`, re-derived at USERS_ITERATIONS like
# run_pooled.sh does), and its upstream URI authenticates as that user too.
# For every run the stand-in's counters ({standinStats: 1, reset: true}) give what reached the
# upstream: connections, authentications, messages and commands by name; divided by all the
# operations the driver completed (warmup included) they show what each driver does per
# operation, and that pooled mode forwards the ping upstream.
#
# Usage: bash bench/serverless_drivers.sh
# Env overrides (defaults in brackets):
#   DURATION [10] measured seconds per run   WARMUP [2] seconds before it (not measured)
#   CONCURRENCY [1,16]  DRIVERS [pymongo,node]  TARGETS [direct,pooled]
#   PY_MODE [process] pymongo's workers: process (one OS process per worker, like separate
#     serverless instances) or thread (threads in one process). Node always runs CONCURRENCY
#     async loops in one process.
#   COMMAND [ping]  POOL_SIZE [16]  APP_USER [app]  APP_PASSWORD [apppw]
#   USERS_ITERATIONS [4096] SCRAM-SHA-256 iterations of the pooled users file; 4096 = the
#     stand-in's (fixed), so a client's PBKDF2 costs the same on both targets (pymongo runs it
#     once per new MongoClient). Empty: what `mongoguard users add` writes (15000).
#   UPSTREAM_DELAY_MS [1]  UPSTREAM_TLS [1]  (as in run_pooled.sh)
#   STANDIN_PORT [27500] POOLED_PORT [27502] RELAY_PORT [27503] ADMIN_PORT [27504] (the pooled
#     mongoguard's admin listener: its /metrics give the driver-side connections and requests
#     per operation) (a busy default slides up)
#   OUT_FILE [docs/benchmarks-serverless-drivers.md]  APPEND [0] 1: append this run's section
#   VENV [/tmp/mongoguard-sdrv-venv] pymongo's virtualenv (created; `pip install pymongo`)
#   SKIP_BUILD=1 and BIN_DIR [target/release]: use already-built binaries
# Needs python3 (venv, pip reaching PyPI) and node >= 20 with npm (reaching the npm registry).
# Everything started here is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
CONCURRENCY="${CONCURRENCY:-1,16}"
DRIVERS="${DRIVERS:-pymongo,node}"
TARGETS="${TARGETS:-direct,pooled}"
PY_MODE="${PY_MODE:-process}"
COMMAND="${COMMAND:-ping}"
POOL_SIZE="${POOL_SIZE:-16}"
APP_USER="${APP_USER:-app}"
APP_PASSWORD="${APP_PASSWORD:-apppw}"
USERS_ITERATIONS="${USERS_ITERATIONS-4096}"
UPSTREAM_DELAY_MS="${UPSTREAM_DELAY_MS:-1}"
UPSTREAM_TLS="${UPSTREAM_TLS:-1}"
OUT_FILE="${OUT_FILE:-docs/benchmarks-serverless-drivers.md}"
APPEND="${APPEND:-0}"
VENV="${VENV:-/tmp/mongoguard-sdrv-venv}"
SD="$ROOT/bench/serverless_drivers"
export RUST_LOG="${RUST_LOG:-warn}"

INVOCATION="DURATION=$DURATION WARMUP=$WARMUP CONCURRENCY=$CONCURRENCY DRIVERS=$DRIVERS"
INVOCATION+=" TARGETS=$TARGETS PY_MODE=$PY_MODE POOL_SIZE=$POOL_SIZE USERS_ITERATIONS=$USERS_ITERATIONS"
INVOCATION+=" UPSTREAM_DELAY_MS=$UPSTREAM_DELAY_MS UPSTREAM_TLS=$UPSTREAM_TLS bash bench/serverless_drivers.sh"

BENCH_NAME=serverless_drivers.sh
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

command -v python3 >/dev/null 2>&1 || die "python3 is needed"

# --- drivers -------------------------------------------------------------------
if [[ ",$DRIVERS," == *,pymongo,* ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating virtualenv $VENV"
        python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    if ! "$VENV/bin/python" -c 'import pymongo' 2>/dev/null; then
        log "pip install pymongo into $VENV"
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q 'pymongo>=4.6,<5'
    fi
    PY_VERSION="$("$VENV/bin/python" -c 'import pymongo, sys; print("pymongo", pymongo.version, "on Python", sys.version.split()[0])')"
    log "$PY_VERSION"
fi
if [[ ",$DRIVERS," == *,node,* ]]; then
    command -v node >/dev/null 2>&1 || die "node is not installed (Node.js >= 20 is needed)"
    lock_sum="$(sha256sum "$SD/node/package-lock.json" | cut -d' ' -f1)"
    if [[ "$(cat "$SD/node/node_modules/.mongoguard-lock.sha256" 2>/dev/null)" != "$lock_sum" ]]; then
        log "npm ci in $SD/node"
        (cd "$SD/node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        echo "$lock_sum" >"$SD/node/node_modules/.mongoguard-lock.sha256"
    fi
    NODE_VERSION="mongodb $(node -p "require('$SD/node/node_modules/mongodb/package.json').version") on Node.js $(node --version)"
    log "$NODE_VERSION"
fi

# --- build -------------------------------------------------------------------
release_binaries mongoguard-standin mongoguard loadgen delayrelay

PORT_S="$(pick_port "${STANDIN_PORT:-}" 27500)"
PICKED+=("$PORT_S")
PORT_Q="$(pick_port "${POOLED_PORT:-}" 27502)"
PICKED+=("$PORT_Q")
PORT_R="$(pick_port "${RELAY_PORT:-}" 27503)"
PICKED+=("$PORT_R")
PORT_A="$(pick_port "${ADMIN_PORT:-}" 27504)"
PICKED+=("$PORT_A")
log "ports: stand-in $PORT_S, pooled $PORT_Q (admin $PORT_A), relay $PORT_R"

# --- stand-in upstream (with a user: every client must authenticate) ----------
"$BIN/mongoguard-standin" --listen "127.0.0.1:$PORT_S" --user "$APP_USER:$APP_PASSWORD" \
    >"$WORK/standin.log" 2>&1 &
STANDIN_PID=$!
PIDS+=("$STANDIN_PID")
wait_for_line "$WORK/standin.log" "mongoguard-standin listening on 127.0.0.1:$PORT_S" "$STANDIN_PID" standin

# --- delayrelay in front of it (the remote mongod) -------------------------------
RELAY_ARGS=(--listen "127.0.0.1:$PORT_R" --upstream "127.0.0.1:$PORT_S" --delay-ms "$UPSTREAM_DELAY_MS")
UP_OPTS=""
if [[ "$UPSTREAM_TLS" == 1 ]]; then
    RELAY_ARGS+=(--tls-self-signed "$WORK/pki")
    UP_OPTS="tls=true&tlsCAFile=$WORK/pki/ca.pem"
fi
"$BIN/delayrelay" "${RELAY_ARGS[@]}" >"$WORK/relay.log" 2>&1 &
RELAY_PID=$!
PIDS+=("$RELAY_PID")
wait_for_line "$WORK/relay.log" "delayrelay listening on 127.0.0.1:$PORT_R" "$RELAY_PID" relay
UP_ADDR="127.0.0.1:$PORT_R"

# --- mongoguard, pooled (users file with the stand-in's user and password) ---------
USERS="$WORK/users.toml"
printf '%s' "$APP_PASSWORD" | "$BIN/mongoguard" users add --file "$USERS" "$APP_USER" \
    >"$WORK/users-add.log" 2>&1 || die "mongoguard users add failed: $(tail -n1 "$WORK/users-add.log")"
if [[ -n "$USERS_ITERATIONS" ]]; then
    # As run_pooled.sh: re-derive the SCRAM-SHA-256 secrets at another iteration count (RFC 5802).
    rederive_scram_users "$USERS" "$USERS_ITERATIONS" || die "rewriting $USERS failed"
fi
cat >"$WORK/pooled.toml" <<TOML
[proxy]
listen = "127.0.0.1:$PORT_Q"
mode = "pooled"

[upstream]
uri = "mongodb://$APP_USER:$APP_PASSWORD@$UP_ADDR/?authSource=admin${UP_OPTS:+&$UP_OPTS}"

[pool]
pool_size = $POOL_SIZE

[auth]
users_file = "$USERS"
TOML
"$BIN/mongoguard" --admin-listen "127.0.0.1:$PORT_A" --config "$WORK/pooled.toml" >"$WORK/pooled.log" 2>&1 &
POOLED_PID=$!
PIDS+=("$POOLED_PID")
wait_for_port "$PORT_Q" "$POOLED_PID" pooled || die "pooled mongoguard did not start: $(tail -n3 "$WORK/pooled.log")"

# The URIs a serverless user would write: SCRAM-SHA-256 against admin, a single server
# (directConnection=true), TLS with the relay's CA for direct, plain for the local mongoguard.
CRED="$APP_USER:$APP_PASSWORD"
AUTH_OPTS="authSource=admin&authMechanism=SCRAM-SHA-256&directConnection=true"
uri_of() {
    case "$1" in
        direct) echo "mongodb://$CRED@$UP_ADDR/?$AUTH_OPTS${UP_OPTS:+&$UP_OPTS}" ;;
        pooled) echo "mongodb://$CRED@127.0.0.1:$PORT_Q/?$AUTH_OPTS" ;;
        *) die "unknown target $1 (direct, pooled)" ;;
    esac
}

# standin_stats: the stand-in's counters since the last call (then zeroed), as one JSON line.
standin_stats() {
    "$BIN/loadgen" --target "standin=127.0.0.1:$PORT_S" --standin-stats --reset 2>>"$WORK/stats.log" ||
        echo '{}'
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"

# mongoguard_metrics: the pooled mongoguard's client-side counters (connections accepted,
# requests by command) as one JSON object, from its Prometheus /metrics.
mongoguard_metrics() {
    python3 - "$PORT_A" <<'PY' 2>>"$WORK/stats.log" || echo '{}'
import json, re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
out = {"commands": {}}
for line in text.splitlines():
    m = re.match(r'mongoguard_client_connections_accepted(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$', line)
    if m:
        out["connectionsAccepted"] = out.get("connectionsAccepted", 0) + float(m.group(1))
    m = re.match(r'mongoguard_requests(?:_total)?\{command="([^"]+)"\} ([0-9.e+]+)$', line)
    if m:
        out["commands"][m.group(1)] = out["commands"].get(m.group(1), 0) + float(m.group(2))
print(json.dumps(out))
PY
}

# cpu_ticks: user + system clock ticks so far of the stand-in, the relay and the pooled
# mongoguard, as "standin relay mongoguard" (from /proc/PID/stat; 0 if unreadable).
cpu_ticks() {
    local pid out=()
    for pid in "$STANDIN_PID" "$RELAY_PID" "$POOLED_PID"; do
        out+=("$(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)")
    done
    echo "${out[*]}"
}
CLK_TCK="$(getconf CLK_TCK 2>/dev/null || echo 100)"

measure() {
    local driver="$1" target="$2" c="$3" uri ticks_before ticks_after
    uri="$(uri_of "$target")"
    standin_stats >/dev/null # zero the counters
    local mg_before='{}'
    [[ "$target" != pooled ]] || mg_before="$(mongoguard_metrics)"
    log "$driver $target concurrency=$c"
    ticks_before="$(cpu_ticks)"
    case "$driver" in
        pymongo)
            "$VENV/bin/python" "$SD/pymongo_serverless.py" --uri "$uri" --concurrency "$c" \
                --duration "$DURATION" --warmup "$WARMUP" --mode "$PY_MODE" --command "$COMMAND" \
                --label "$target" >"$WORK/run.json" 2>>"$WORK/driver.log" ||
                die "pymongo run failed (see $WORK/driver.log)"
            ;;
        node)
            node "$SD/node/serverless.mjs" --uri "$uri" --concurrency "$c" \
                --duration "$DURATION" --warmup "$WARMUP" --command "$COMMAND" \
                --label "$target" >"$WORK/run.json" 2>>"$WORK/driver.log" ||
                die "node run failed (see $WORK/driver.log)"
            ;;
        *) die "unknown driver $driver (pymongo, node)" ;;
    esac
    ticks_after="$(cpu_ticks)"
    local stats mg_after='{}'
    stats="$(standin_stats)"
    [[ "$target" != pooled ]] || mg_after="$(mongoguard_metrics)"
    python3 - "$WORK/run.json" "$stats" "$target" "$mg_before" "$mg_after" "$ticks_before" "$ticks_after" "$CLK_TCK" >>"$RESULTS" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))
tb, ta, tck = sys.argv[6].split(), sys.argv[7].split(), float(sys.argv[8])
row["server_cpu_s"] = {name: (int(a) - int(b)) / tck for name, b, a in zip(("standin", "relay", "mongoguard"), tb, ta)}
row["standin"] = json.loads(sys.argv[2]) if sys.argv[2].strip() else {}
row["target"] = sys.argv[3]
before, after = json.loads(sys.argv[4]), json.loads(sys.argv[5])
if "connectionsAccepted" in after:
    cmds = {k: v - before.get("commands", {}).get(k, 0) for k, v in after["commands"].items()}
    row["mongoguard"] = {
        "connectionsAccepted": after["connectionsAccepted"] - before.get("connectionsAccepted", 0),
        "commands": {k: v for k, v in cmds.items() if v},
    }
print(json.dumps(row))
PY
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
DATE_START="$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
IFS=',' read -r -a L_DRIVERS <<<"$DRIVERS"
IFS=',' read -r -a L_CONC <<<"$CONCURRENCY"
IFS=',' read -r -a L_TARGETS <<<"$TARGETS"
for d in "${L_DRIVERS[@]}"; do
    for c in "${L_CONC[@]}"; do
        for t in "${L_TARGETS[@]}"; do
            measure "$d" "$t" "$c"
        done
    done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

for name in STANDIN RELAY POOLED; do
    pid_var="${name}_PID"
    kill -0 "${!pid_var}" 2>/dev/null || die "${name,,} died during the run"
done
POOLED_LOG_LINES="$(grep -c . "$WORK/pooled.log" || true)"

# --- record ------------------------------------------------------------------
CPU_MODEL="$(grep -m1 -E '^(model name|Hardware|Processor)' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
{
    echo "## Run of $DATE_START"
    echo ""
    echo "- date: $DATE_START; commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
    echo "- nproc: $(nproc); CPU: ${CPU_MODEL:-unknown}"
    echo "- load average before / after: $LOAD_BEFORE / $LOAD_AFTER (other work on the machine skews results)"
    echo "- command: \`$INVOCATION\`"
    echo "- drivers: ${PY_VERSION:-pymongo not run}; ${NODE_VERSION:-node not run}"
    echo "- pymongo workers: $PY_MODE$([[ $PY_MODE == process ]] && echo "es (one OS process per concurrent client)" || echo "s in one process"); Node.js: CONCURRENCY async loops in one process"
    echo "- upstream: mongoguard-standin --user $APP_USER (in-memory stand-in, SCRAM-SHA-256 at 4096 iterations) behind a delayrelay: ${UPSTREAM_DELAY_MS} ms each way, +1 round trip before a new connection's first byte, TLS $([[ "$UPSTREAM_TLS" == 1 ]] && echo "terminated by the relay behind the delay (self-signed ECDSA P-256)" || echo off)"
    echo "- pooled: mongoguard mode = \"pooled\", pool_size = $POOL_SIZE, users file iterations ${USERS_ITERATIONS:-15000}, upstream through the relay; local to the driver (no delay, no TLS)"
    echo "- mongoguard (pooled) log lines at its default log level (info) during the whole run: $POOLED_LOG_LINES (first 5 below, cut at 200 characters)"
    if [[ "$POOLED_LOG_LINES" != 0 ]]; then
        echo ""
        echo '```'
        head -n 5 "$WORK/pooled.log" | cut -c1-200
        echo '```'
    fi
    echo ""
    python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]

def n(v, f="{:,.0f}"):
    return f.format(v) if isinstance(v, (int, float)) else "-"

print("| driver | target | conc | ops/s | p50 µs | p99 µs | errors | ops (all) | upstream conns/op | auths/op | messages/op | upstream commands per op | pooled: driver conns/op, requests per op | CPU ms/op: driver / relay / stand-in / mongoguard |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
for r in rows:
    s, ops = r.get("standin") or {}, r.get("ops_all") or 0
    def per(k):
        v = s.get(k)
        return f"{v / ops:.2f}" if isinstance(v, (int, float)) and ops else "-"
    cmds = s.get("commands") or {}
    # standinStats itself (the reading connection) is not the driver's
    parts = [f"{k} {v / ops:.2f}" for k, v in sorted(cmds.items()) if k != "standinstats" and ops]
    mg = r.get("mongoguard")
    client = "-"
    if mg and ops:
        client = f"conns {mg['connectionsAccepted'] / ops:.2f}; " + ", ".join(
            f"{k} {v / ops:.2f}" for k, v in sorted(mg["commands"].items()))
    sc = r.get("server_cpu_s") or {}
    ms = lambda v: f"{1000 * v / ops:.2f}" if isinstance(v, (int, float)) and ops else "-"
    cpu = " / ".join([ms(r.get("client_cpu_s")), ms(sc.get("relay")), ms(sc.get("standin")),
                      ms(sc.get("mongoguard")) if r["target"] == "pooled" else "-"])
    print(f"| {r['driver']} | {r['target']} | {r['concurrency']} | {n(r['ops_per_sec'])} | {n(r['p50_us'])} | {n(r['p99_us'])} "
          f"| {r['errors']} | {n(ops)} | {per('connectionsAccepted')} | {per('authentications')} | {per('messages')} | {', '.join(parts) or '-'} | {client} | {cpu} |")
print()
print("Pooled against direct (same driver, same concurrency): ops/s ratio = pooled / direct;")
print("p50 and p99 ratios = direct / pooled (above 1: pooled is faster).")
print()
print("| driver | conc | ops/s direct | ops/s pooled | ops/s ratio | p50 ratio | p99 ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    if r["target"] != "pooled":
        continue
    b = next((x for x in rows if x["target"] == "direct" and x["driver"] == r["driver"] and x["concurrency"] == r["concurrency"]), None)
    if not b or not b["ops_per_sec"] or not r["ops_per_sec"]:
        continue
    print(f"| {r['driver']} | {r['concurrency']} | {n(b['ops_per_sec'])} | {n(r['ops_per_sec'])} | {r['ops_per_sec'] / b['ops_per_sec']:.2f}x "
          f"| {b['p50_us'] / r['p50_us']:.2f}x | {b['p99_us'] / r['p99_us']:.2f}x |")
print()
errs = [r for r in rows if r.get("first_error")]
for r in errs:
    print(f"- first error, {r['driver']} {r['target']} c={r['concurrency']}: {r['first_error']}")
if errs:
    print()
PY
} >"$WORK/section.md"
mkdir -p "$(dirname "$OUT_FILE")"
if [[ "$APPEND" == 1 && -f "$OUT_FILE" ]]; then
    { echo ""; cat "$WORK/section.md"; } >>"$OUT_FILE"
else
    {
        echo "# Benchmarks: serverless with real drivers (new client per operation)"
        echo ""
        echo "Written by \`bench/serverless_drivers.sh\` (see its header). Each operation: construct a"
        echo "new client from a URI, \`ping\` the admin database, close the client. ops/s and latency"
        echo "count the operations completed in the measured window; \"ops (all)\" also counts the"
        echo "warmup; the per-op upstream columns are the stand-in's counters over the whole run"
        echo "(warmup included) divided by \"ops (all)\" (\`standinstats\`, the counter read itself, left out)."
        echo ""
        cat "$WORK/section.md"
    } >"$OUT_FILE"
fi
cat "$WORK/section.md"
log "wrote $OUT_FILE"
