#!/usr/bin/env bash
# Three-path latency/throughput comparison on one machine:
#
#   loadgen -> stand-in                       (direct)
#   loadgen -> mongoguard -> stand-in         (mongoguard)
#   loadgen -> haproxy (mode tcp) -> stand-in (haproxy: a plain L4 relay)
#   loadgen -> tokiorelay -> stand-in         (with TOKIO_RELAY=1: the cheapest Tokio relay,
#                                              mongoguard's thread layout, inspecting nothing)
#   loadgen -> mongoguard-pgo -> stand-in     (with PGO=1: mongoguard built by
#                                              scripts/build-pgo.sh, as the image ships it)
#
# Usage: bench/run.sh [extra loadgen args...]
# Env overrides (defaults in brackets):
#   DURATION [10]  WARMUP [2]  OPS [ping,find,insert]  CONCURRENCY [1,64]  DOCS [10000]
#   STANDIN_PORT [27100]  MONGOGUARD_PORT [27101]  HAPROXY_PORT [27102]
#     (a busy default port is replaced by the next free one; an explicit busy one is an error)
#   HAPROXY_NBTHREAD [haproxy's default: one per CPU]
#   TOKIO_RELAY [0]  TOKIO_RELAY_PORT [27103]: 1 adds the tokiorelay target (bench/src/bin/tokiorelay.rs)
#   PGO [0]  PGO_PORT [27104]  PGO_BIN [target/pgo/mongoguard]: 1 adds the mongoguard-pgo target,
#     built by scripts/build-pgo.sh first unless SKIP_BUILD=1 (then PGO_BIN must exist)
#   MONGOGUARD_ARGS [] extra flags for mongoguard, e.g. "--policy bench/policy-off.toml"
#   OUT_FILE [docs/benchmarks-latest.md]   RUST_LOG [warn, for the stand-in; mongoguard reads only
#     --log-level / its config and runs at its default, info, as in production: pass
#     MONGOGUARD_ARGS="--log-level warn" to change it]
#   SKIP_BUILD=1 and BIN_DIR [target/release]: use already-built binaries
# Everything started here is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
OPS="${OPS:-ping,find,insert}"
CONCURRENCY="${CONCURRENCY:-1,64}"
DOCS="${DOCS:-10000}"
OUT_FILE="${OUT_FILE:-docs/benchmarks-latest.md}"
export RUST_LOG="${RUST_LOG:-warn}"
# shell_words ARGS...: the arguments as one copy-pasteable command line.
shell_words() {
    local out="" a
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./=:,@+%-]+$ ]]; then
            out+="$a "
        else
            out+="$(printf '%q' "$a") "
        fi
    done
    printf '%s' "${out% }"
}
INVOCATION="$(shell_words "DURATION=$DURATION" "WARMUP=$WARMUP" "OPS=$OPS" \
    "CONCURRENCY=$CONCURRENCY" "DOCS=$DOCS" "TOKIO_RELAY=${TOKIO_RELAY:-0}" "PGO=${PGO:-0}" \
    bench/run.sh "$@")"

BENCH_NAME=run.sh
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

# --- prerequisites -----------------------------------------------------------
if ! command -v haproxy >/dev/null 2>&1; then
    log "installing haproxy"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update
    $SUDO apt-get install -y haproxy
fi

TOKIO_RELAY="${TOKIO_RELAY:-0}"
if [[ "$TOKIO_RELAY" == 1 ]]; then
    release_binaries mongoguard-standin mongoguard loadgen tokiorelay
else
    release_binaries mongoguard-standin mongoguard loadgen
fi
PGO="${PGO:-0}"
PGO_BIN="${PGO_BIN:-$ROOT/target/pgo/mongoguard}"
if [[ "$PGO" == 1 ]]; then
    if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
        log "building the PGO binary (scripts/build-pgo.sh)"
        PGO_OUT="$PGO_BIN" bash "$ROOT/scripts/build-pgo.sh"
    fi
    [[ -x "$PGO_BIN" ]] || die "missing binary $PGO_BIN (PGO=1; run scripts/build-pgo.sh)"
fi

PORT_A="$(pick_port "${STANDIN_PORT:-}" 27100)"
PICKED+=("$PORT_A")
PORT_B="$(pick_port "${MONGOGUARD_PORT:-}" 27101)"
PICKED+=("$PORT_B")
PORT_C="$(pick_port "${HAPROXY_PORT:-}" 27102)"
log "ports: stand-in $PORT_A, mongoguard $PORT_B, haproxy $PORT_C"

# --- stand-in upstream -------------------------------------------------------
"$BIN/mongoguard-standin" --listen "127.0.0.1:$PORT_A" >"$WORK/standin.log" 2>&1 &
STANDIN_PID=$!
PIDS+=("$STANDIN_PID")
wait_for_line "$WORK/standin.log" "mongoguard-standin listening on 127.0.0.1:$PORT_A" "$STANDIN_PID" standin

# --- mongoguard --------------------------------------------------------------
# shellcheck disable=SC2086 # MONGOGUARD_ARGS is a list of extra flags
"$BIN/mongoguard" --admin-listen off --listen "127.0.0.1:$PORT_B" --upstream "mongodb://127.0.0.1:$PORT_A" ${MONGOGUARD_ARGS:-} \
    >"$WORK/mongoguard.log" 2>&1 &
MONGOGUARD_PID=$!
PIDS+=("$MONGOGUARD_PID")
wait_for_port "$PORT_B" "$MONGOGUARD_PID" mongoguard || die "mongoguard did not start"

# --- haproxy (plain TCP relay) -----------------------------------------------
# HAProxy 2.6 has no "option tcp-nodelay": it sets TCP_NODELAY on its sockets
# itself and only delays sends (MSG_MORE) when it knows more data follows.
HAPROXY_CFG="$WORK/haproxy.cfg"
{
    echo "global"
    echo "    maxconn 4096"
    if [[ -n "${HAPROXY_NBTHREAD:-}" ]]; then
        echo "    nbthread $HAPROXY_NBTHREAD"
    fi
    echo ""
    echo "defaults"
    echo "    mode tcp"
    echo "    timeout connect 5s"
    echo "    timeout client 1h"
    echo "    timeout server 1h"
    echo ""
    echo "listen mongo"
    echo "    bind 127.0.0.1:$PORT_C"
    echo "    server standin 127.0.0.1:$PORT_A"
} >"$HAPROXY_CFG"
haproxy -c -q -f "$HAPROXY_CFG" || die "invalid haproxy config $HAPROXY_CFG"
haproxy -db -f "$HAPROXY_CFG" >"$WORK/haproxy.log" 2>&1 &
HAPROXY_PID=$!
PIDS+=("$HAPROXY_PID")
wait_for_port "$PORT_C" "$HAPROXY_PID" haproxy || die "haproxy did not start"

# --- tokiorelay (optional floor) ---------------------------------------------
EXTRA_TARGETS=()
PROCS=(standin mongoguard haproxy)
if [[ "$TOKIO_RELAY" == 1 ]]; then
    PORT_D="$(pick_port "${TOKIO_RELAY_PORT:-}" 27103)"
    PICKED+=("$PORT_D")
    "$BIN/tokiorelay" --listen "127.0.0.1:$PORT_D" --upstream "127.0.0.1:$PORT_A" >"$WORK/tokiorelay.log" 2>&1 &
    TOKIORELAY_PID=$!
    PIDS+=("$TOKIORELAY_PID")
    wait_for_line "$WORK/tokiorelay.log" "tokiorelay listening on 127.0.0.1:$PORT_D" "$TOKIORELAY_PID" tokiorelay
    EXTRA_TARGETS=(--target "tokiorelay=127.0.0.1:$PORT_D" --cpu-pid "tokiorelay=$TOKIORELAY_PID")
    PROCS+=(tokiorelay)
fi
if [[ "$PGO" == 1 ]]; then
    PORT_E="$(pick_port "${PGO_PORT:-}" 27104)"
    PICKED+=("$PORT_E")
    # shellcheck disable=SC2086 # MONGOGUARD_ARGS is a list of extra flags
    "$PGO_BIN" --admin-listen off --listen "127.0.0.1:$PORT_E" --upstream "mongodb://127.0.0.1:$PORT_A" ${MONGOGUARD_ARGS:-} \
        >"$WORK/pgo.log" 2>&1 &
    PGO_PID=$!
    PIDS+=("$PGO_PID")
    wait_for_port "$PORT_E" "$PGO_PID" pgo || die "mongoguard-pgo did not start"
    EXTRA_TARGETS+=(--target "mongoguard-pgo=127.0.0.1:$PORT_E" --cpu-pid "mongoguard-pgo=$PGO_PID")
    PROCS+=(pgo)
fi

# --- measure -----------------------------------------------------------------
LOADGEN_ARGS=(
    --target "direct=127.0.0.1:$PORT_A"
    --target "mongoguard=127.0.0.1:$PORT_B"
    --target "haproxy=127.0.0.1:$PORT_C"
    --cpu-pid "direct=$STANDIN_PID"
    --cpu-pid "mongoguard=$MONGOGUARD_PID"
    --cpu-pid "haproxy=$HAPROXY_PID"
    ${EXTRA_TARGETS[@]+"${EXTRA_TARGETS[@]}"}
    --concurrency "$CONCURRENCY"
    --op "$OPS"
    --duration "$DURATION"
    --warmup "$WARMUP"
    --docs "$DOCS"
    "$@"
)
# Recorded relative to the repository (no absolute path of this machine in docs/).
LOADGEN_CMD="$(shell_words "${BIN#"$ROOT"/}/loadgen" "${LOADGEN_ARGS[@]}")"
log "running: $LOADGEN_CMD"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/loadgen" "${LOADGEN_ARGS[@]}" --out "$WORK/tables.md"
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

for name in "${PROCS[@]}"; do
    pid_var="${name^^}_PID"
    kill -0 "${!pid_var}" 2>/dev/null || die "$name died during the run (see $WORK/$name.log)"
done

# --- record ------------------------------------------------------------------
CPU_MODEL="$(grep -m1 -E '^(model name|Hardware|Processor)' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
mkdir -p "$(dirname "$OUT_FILE")"
{
    echo "# Benchmarks: direct vs mongoguard vs haproxy"
    echo ""
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
    echo "- nproc: $(nproc)"
    echo "- CPU: ${CPU_MODEL:-unknown}"
    echo "- haproxy: $(haproxy -v | head -n1)"
    echo "- haproxy nbthread: ${HAPROXY_NBTHREAD:-default}; stand-in RUST_LOG=$RUST_LOG; mongoguard log level: its default (info) unless MONGOGUARD_ARGS sets --log-level"
    echo "- load average before / after: $LOAD_BEFORE / $LOAD_AFTER (other work on the machine skews results)"
    echo "- upstream: mongoguard-standin (in-memory stand-in, not mongod)"
    echo "- command: \`$INVOCATION\`"
    echo "- mongoguard flags: \`--listen ... --upstream ... ${MONGOGUARD_ARGS:-}\` (policy: ${MONGOGUARD_ARGS:+see flags}${MONGOGUARD_ARGS:-built-in standard profile})"
    echo "- loadgen: \`$LOADGEN_CMD\`"
    if [[ "$TOKIO_RELAY" == 1 ]]; then
        echo "- tokiorelay: bench/src/bin/tokiorelay.rs (copy_bidirectional on $(nproc) current-thread loops, inspects nothing)"
    fi
    if [[ "$PGO" == 1 ]]; then
        echo "- mongoguard-pgo: the same sources built by scripts/build-pgo.sh (profile-guided, fat LTO; what the container image ships), same flags as mongoguard"
    fi
    echo ""
    echo "All processes (loadgen, stand-in, mongoguard, haproxy) share this machine's"
    echo "$(nproc) CPUs, so throughput at high concurrency is CPU-bound and mostly"
    echo "compares CPU cost per request; latencies are closed-loop (one request in"
    echo "flight per connection), in microseconds. Targets are interleaved per"
    echo "(op, concurrency) so drifting background load hits them alike."
    echo ""
    cat "$WORK/tables.md"
} >"$OUT_FILE"
log "wrote $OUT_FILE"
