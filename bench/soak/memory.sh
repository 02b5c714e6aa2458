#!/usr/bin/env bash
# Memory of mongoguard per allocator and mode (docs/memory.md):
#
#   for each ALLOCATOR x MODE: a fresh stand-in and a fresh mongoguard (release build), then
#     1. RSS at rest;
#     2. for each N in IDLE_COUNTS: N idle clients (connected, hello answered, idle), RSS, all
#        leave, RSS AFTER_S seconds later (bench/idle_clients.py idle);
#     3. a burst: BURST_CLIENTS clients each send one BURST_MB MiB insert and leave, BURST_ROUNDS
#        times; peak RSS and RSS AFTER_S seconds later (bench/idle_clients.py burst);
#     4. a short bench/run.sh-style point: loadgen insert,find at LOAD_CONCURRENCY for
#        LOAD_DURATION s; ops/s and mongoguard CPU (utime + stime from /proc/PID/stat) per op;
#     5. RSS at the end.
#
# Allocators: "asbuilt" runs the binary as built; "jemalloc" / "mimalloc" run the same binary
# with LD_PRELOAD of the distribution's shared library (Debian: libjemalloc2, libmimalloc2.0;
# installed with apt-get when missing and we are root). Rust's default global allocator calls
# malloc/free, so the preload replaces it for every Rust allocation; a binary with its own
# #[global_allocator] is not affected by the preload (run it as "asbuilt"). "glibc-arena2" is
# the binary as built with GLIBC_TUNABLES=glibc.malloc.arena_max=2 (glibc with fewer arenas);
# "jemalloc-bg" the jemalloc preload with MALLOC_CONF=background_thread:true (jemalloc's own
# thread purges freed memory while the process is otherwise idle).
#
# Env (defaults in brackets):
#   ALLOCATORS [asbuilt,jemalloc,mimalloc]  MODES [passthrough,pooled]  IDLE_COUNTS [5000,10000]
#   HOLD_S [3]  AFTER_S [5]  BURST_CLIENTS [64]  BURST_MB [4]  BURST_ROUNDS [2]
#   LOAD_DURATION [5]  LOAD_CONCURRENCY [64]  LABEL [] a name for "asbuilt" in the output
#   AUTH [0]  1: the stand-in has a user (APP_USER:APP_PASSWORD, default app:apppw) and every
#     idle client authenticates with SCRAM-SHA-256 (idle_clients.py --user): passthrough
#     passes the conversation to the stand-in; pooled authenticates clients itself (users file
#     from `mongoguard users add`, no allow_unauthenticated) with the user in its upstream URI.
#     Needs IDLE_ONLY=1 (the burst clients do not authenticate).
#   IDLE_ONLY [0]  1: only the idle-client steps (no burst, no load point)
#   SKIP_BUILD=1 and BIN_DIR [target/release]   PY [integration/.venv/bin/python]
#   OUT_JSONL [bench-memory.jsonl in the work dir, printed at the end]
# Everything started here is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

ALLOCATORS="${ALLOCATORS:-asbuilt,jemalloc,mimalloc}"
MODES="${MODES:-passthrough,pooled}"
IDLE_COUNTS="${IDLE_COUNTS:-5000,10000}"
HOLD_S="${HOLD_S:-3}"
AFTER_S="${AFTER_S:-5}"
BURST_CLIENTS="${BURST_CLIENTS:-64}"
BURST_MB="${BURST_MB:-4}"
BURST_ROUNDS="${BURST_ROUNDS:-2}"
LOAD_DURATION="${LOAD_DURATION:-5}"
LOAD_CONCURRENCY="${LOAD_CONCURRENCY:-64}"
export RUST_LOG="${RUST_LOG:-warn}"
AUTH="${AUTH:-0}"
IDLE_ONLY="${IDLE_ONLY:-0}"
APP_USER="${APP_USER:-app}"
APP_PASSWORD="${APP_PASSWORD:-apppw}"

BENCH_NAME=memory.sh
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

PY="${PY:-$ROOT/integration/.venv/bin/python}"
[[ -x "$PY" ]] || die "no python with pymongo at $PY (run: bash -c 'source integration/common.sh; setup_python')"
[[ "$AUTH" != 1 || "$IDLE_ONLY" == 1 ]] || die "AUTH=1 needs IDLE_ONLY=1 (burst clients do not authenticate)"

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    log "building release binaries"
    cargo build --release -p mongoguard-standin -p mongoguard -p mongoguard-bench
fi
BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}"
for b in mongoguard-standin mongoguard loadgen; do
    [[ -x "$BIN/$b" ]] || die "missing binary $BIN/$b"
done
STANDIN_USER_ARGS=()
IDLE_AUTH_ARGS=()
if [[ "$AUTH" == 1 ]]; then
    STANDIN_USER_ARGS=(--user "$APP_USER:$APP_PASSWORD")
    IDLE_AUTH_ARGS=(--user "$APP_USER" --password "$APP_PASSWORD")
    printf '%s' "$APP_PASSWORD" | "$BIN/mongoguard" users add --file "$WORK/users.toml" "$APP_USER" \
        >"$WORK/users-add.log" 2>&1 || die "mongoguard users add failed (see $WORK/users-add.log)"
fi

# Passthrough holds two sockets per idle client (client + upstream), pooled one. Raise the soft
# limit to the hard one; a passthrough count that does not fit is lowered to what fits (logged
# and marked "capped" in the results): raising the hard limit needs CAP_SYS_RESOURCE.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE="$(ulimit -n)"
log "ulimit -n: $NOFILE"

LIBDIR="$(dirname "$(gcc -print-file-name=libc.so.6 2>/dev/null || echo /usr/lib/x86_64-linux-gnu/libc.so.6)")"
[[ -d "$LIBDIR" ]] || LIBDIR=/usr/lib/x86_64-linux-gnu
preload_of() {
    case "$1" in
        asbuilt | glibc-arena2) echo "" ;;
        jemalloc | jemalloc-bg) echo "${JEMALLOC_SO:-$LIBDIR/libjemalloc.so.2}" ;;
        mimalloc) echo "${MIMALLOC_SO:-$LIBDIR/libmimalloc.so.2}" ;;
        *) die "unknown allocator $1 (asbuilt, glibc-arena2, jemalloc, jemalloc-bg, mimalloc)" ;;
    esac
}
for a in ${ALLOCATORS//,/ }; do
    so="$(preload_of "$a")"
    if [[ -n "$so" && ! -e "$so" ]]; then
        [[ $(id -u) -eq 0 ]] || die "$so missing (apt-get install libjemalloc2 libmimalloc2.0)"
        log "installing libjemalloc2 libmimalloc2.0"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2 libmimalloc2.0) >/dev/null
        [[ -e "$so" ]] || die "$so still missing"
    fi
done

OUT_JSONL="${OUT_JSONL:-$WORK/bench-memory.jsonl}"
: >"$OUT_JSONL"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# emit ALLOC MODE STEP JSON: one result line.
emit() {
    "$PY" -c 'import json,sys; d=json.loads(sys.argv[4]); d.update(allocator=sys.argv[1], mode=sys.argv[2], step=sys.argv[3]); print(json.dumps(d))' \
        "$1" "$2" "$3" "$4" | tee -a "$OUT_JSONL"
}

stop_pid() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# start_mg ALLOC MODE PORT: a fresh mongoguard (pid in MG_PID), listening, 1 s settled.
start_mg() {
    local alloc="$1" mode="$2" gp="$3" so
    so="$(preload_of "$alloc")"
    local tunables="${GLIBC_TUNABLES:-}"
    [[ "$alloc" != glibc-arena2 ]] || tunables="glibc.malloc.arena_max=2"
    local mconf="${MALLOC_CONF:-}"
    [[ "$alloc" != jemalloc-bg ]] || mconf="background_thread:true"
    MALLOC_CONF="$mconf" GLIBC_TUNABLES="$tunables" LD_PRELOAD="$so" "$BIN/mongoguard" --admin-listen off --config "$WORK/mg-$mode.toml" \
        >>"$WORK/mongoguard-$alloc-$mode.log" 2>&1 &
    MG_PID=$!
    PIDS+=("$MG_PID")
    wait_for_port "$gp" "$MG_PID" "mongoguard-$alloc-$mode" || die "mongoguard ($alloc, $mode) did not start"
    if [[ -n "$so" ]]; then
        grep -q "$(basename "$so")" "/proc/$MG_PID/maps" || die "$so is not mapped into mongoguard"
    fi
    sleep 1
}

run_one() {
    local alloc="$1" mode="$2" label="$1"
    [[ "$alloc" != asbuilt || -z "${LABEL:-}" ]] || label="$LABEL"
    local sp gp
    sp="$(pick_port "" 27300)"
    PICKED+=("$sp")
    gp="$(pick_port "" 27301)"
    PICKED+=("$gp")
    "$BIN/mongoguard-standin" --listen "127.0.0.1:$sp" ${STANDIN_USER_ARGS[@]+"${STANDIN_USER_ARGS[@]}"} \
        >"$WORK/standin-$alloc-$mode.log" 2>&1 &
    local standin_pid=$!
    PIDS+=("$standin_pid")
    wait_for_line "$WORK/standin-$alloc-$mode.log" "mongoguard-standin listening on 127.0.0.1:$sp" "$standin_pid" standin

    cat >"$WORK/mg-$mode.toml" <<TOML
[proxy]
listen = "127.0.0.1:$gp"
mode = "$mode"
max_client_connections = 20000

[upstream]
uri = "mongodb://127.0.0.1:$sp"

[auth]
allow_unauthenticated = true
TOML
    if [[ "$mode" == pooled && "$AUTH" == 1 ]]; then
        cat >"$WORK/mg-$mode.toml" <<TOML
[proxy]
listen = "127.0.0.1:$gp"
mode = "pooled"
max_client_connections = 20000

[upstream]
uri = "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$sp/?authSource=admin"

[auth]
users_file = "$WORK/users.toml"
TOML
    fi
    [[ "$mode" == pooled ]] || sed -i '/^\[auth\]/,$d' "$WORK/mg-$mode.toml"
    local n want per_client=1 mg
    [[ "$mode" != passthrough ]] || per_client=2
    for want in ${IDLE_COUNTS//,/ }; do
        n="$want"
        if ((n * per_client + 200 > NOFILE)); then
            n=$(((NOFILE - 200) / per_client / 100 * 100))
            log "$label $mode: $want idle clients need $((want * per_client)) descriptors (ulimit -n $NOFILE): measuring $n"
        fi
        start_mg "$alloc" "$mode" "$gp"
        mg="$MG_PID"
        log "$label $mode: $n idle clients (fresh mongoguard)"
        emit "$label" "$mode" "idle-$want" "$("$PY" bench/idle_clients.py idle --port "$gp" --pid "$mg" -n "$n" \
            --hold "$HOLD_S" --after "$AFTER_S" ${IDLE_AUTH_ARGS[@]+"${IDLE_AUTH_ARGS[@]}"} --json)"
        stop_pid "$mg"
    done
    if [[ "$IDLE_ONLY" == 1 ]]; then
        stop_pid "$standin_pid"
        return
    fi

    start_mg "$alloc" "$mode" "$gp"
    mg="$MG_PID"
    emit "$label" "$mode" start "{\"rss_kib\": $(awk '/^VmRSS/{print $2}' "/proc/$mg/status")}"
    log "$label $mode: burst of $BURST_CLIENTS x $BURST_MB MiB inserts, $BURST_ROUNDS rounds"
    emit "$label" "$mode" burst "$("$PY" bench/idle_clients.py burst --port "$gp" --pid "$mg" -c "$BURST_CLIENTS" \
        --mb "$BURST_MB" --rounds "$BURST_ROUNDS" --after "$AFTER_S" --json)"

    log "$label $mode: loadgen insert,find c=$LOAD_CONCURRENCY ${LOAD_DURATION}s"
    "$BIN/loadgen" --target "guard=127.0.0.1:$gp" --setup-only --docs 1000 >/dev/null 2>>"$WORK/loadgen.log"
    local t0 t1 hz
    hz="$(getconf CLK_TCK)"
    t0="$(cpu_ticks "$mg")"
    "$BIN/loadgen" --target "guard=127.0.0.1:$gp" --op insert,find --concurrency "$LOAD_CONCURRENCY" \
        --duration "$LOAD_DURATION" --warmup 1 --docs 1000 --no-setup --json >"$WORK/load.json" 2>>"$WORK/loadgen.log"
    t1="$(cpu_ticks "$mg")"
    emit "$label" "$mode" load "$("$PY" - "$WORK/load.json" "$((t1 - t0))" "$hz" "$LOAD_DURATION" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
ticks, hz, dur = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
out = {}
ops = 0
for r in run["results"]:
    out[f"{r['op']}_ops_s"] = round(r["ops_per_sec"])
    out[f"{r['op']}_p99_us"] = r["p99_us"]
    out[f"{r['op']}_errors"] = r["errors"]
    ops += r.get("ops_total") or r["ops_per_sec"] * dur
# CPU includes the 1 s warmups; so does ops_total when loadgen reports it.
out["cpu_s"] = round(ticks / hz, 2)
out["cpu_us_per_op"] = round(ticks / hz * 1e6 / ops, 1) if ops else None
print(json.dumps(out))
PY
)"
    sleep "$AFTER_S"
    emit "$label" "$mode" end "{\"rss_kib\": $(awk '/^VmRSS/{print $2}' "/proc/$mg/status")}"
    kill -0 "$mg" 2>/dev/null || die "mongoguard ($alloc, $mode) died"
    stop_pid "$mg"
    stop_pid "$standin_pid"
}

for alloc in ${ALLOCATORS//,/ }; do
    for mode in ${MODES//,/ }; do
        run_one "$alloc" "$mode"
    done
done

log "results ($OUT_JSONL):"
"$PY" bench/soak/memtable.py "$OUT_JSONL"
if [[ "$OUT_JSONL" == "$WORK/"* ]]; then
    cp "$OUT_JSONL" "$ROOT/target/bench-memory-last.jsonl" 2>/dev/null || true
fi
