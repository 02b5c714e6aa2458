#!/usr/bin/env bash
# Soak (not in CI): mixed load through BOTH mongoguard modes at once, over one 3-member stand-in
# replica set, with step-downs and kill -9 + restart of the upstream on a schedule; an
# acknowledged-write ledger checked at the end and the RSS of each mongoguard sampled every
# minute. See docs/soak.md.
#
#   pymongo driver (bench/soak/driver.py) -> mongoguard passthrough -\
#                                                                     > stand-in rs0, 3 members
#   pymongo driver (bench/soak/driver.py) -> mongoguard pooled ------/   (one process)
#
# Every insert the driver reports acknowledged is a ledger line with a unique _id. The
# stand-in's store is in memory and dies with a kill -9, so the ledger is checked per store
# epoch: right before each kill a snapshot of every _id is read straight from a member; the
# last snapshot is taken after the drivers stop (bench/soak/check.py explains the rules).
# Exit status: 0 = nothing acknowledged lost, nothing doubled, no unknown document, each mode
# acknowledged new inserts within RESUME_LIMIT seconds of every event, both mongoguards alive at
# the end; 1 otherwise. Everything started here is stopped on exit.
#
# Env (defaults in brackets):
#   SOAK_MINUTES [30]  EVENT_INTERVAL [120] seconds between fault events
#   EVENTS [stepdown,stepdown,kill] the cycle of events (stepdown: standinStepDown to the next
#     member, 1 s without a primary; kill: snapshot, kill -9 the stand-in, RESTART_GAP s, restart
#     it on the same ports)
#   RESTART_GAP [2]  STEPDOWN_GAP_MS [1000]
#   WRITERS [4] READERS [2] per driver  RATE [0] inserts/s per writer (0: unthrottled)
#   WARMUP_MIN [1] minutes left out of the RSS trend
#   RESUME_LIMIT [15] seconds: a mode that acknowledges no insert sent after a step-down or kill
#     within this long fails the run (0: not checked)
#   SOAK_DIR [target/soak/<UTC time>] ledgers, snapshots, logs and report.md (kept)
#   STANDIN_PORT [27400, members on +1 and +2]  PASSTHROUGH_PORT [27410]  POOLED_PORT [27411]
#   POOL_SIZE [8]  RUST_LOG [info]  PY [integration/.venv/bin/python, created if missing]
#   SKIP_BUILD=1 and BIN_DIR [target/release]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SOAK_MINUTES="${SOAK_MINUTES:-30}"
EVENT_INTERVAL="${EVENT_INTERVAL:-120}"
EVENTS="${EVENTS:-stepdown,stepdown,kill}"
RESTART_GAP="${RESTART_GAP:-2}"
STEPDOWN_GAP_MS="${STEPDOWN_GAP_MS:-1000}"
WRITERS="${WRITERS:-4}"
READERS="${READERS:-2}"
RATE="${RATE:-0}"
WARMUP_MIN="${WARMUP_MIN:-1}"
RESUME_LIMIT="${RESUME_LIMIT:-15}"
POOL_SIZE="${POOL_SIZE:-8}"
SOAK_DIR="${SOAK_DIR:-$ROOT/target/soak/$(date -u +%Y%m%dT%H%M%SZ)}"
export RUST_LOG="${RUST_LOG:-info}"
APP_USER=app
APP_PASSWORD=apppw

BENCH_NAME=soak.sh
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
mkdir -p "$SOAK_DIR"
log "run directory: $SOAK_DIR"

# --- prerequisites -----------------------------------------------------------
if [[ -z "${PY:-}" ]]; then
    PY="$ROOT/integration/.venv/bin/python"
    if ! "$PY" -c 'import pymongo' 2>/dev/null; then
        log "setting up integration/.venv (pymongo)"
        PY="$(bash -c 'source integration/common.sh && setup_python >&2 && echo "$PY"')" || die "no python with pymongo"
    fi
fi
"$PY" -c 'import pymongo' || die "$PY has no pymongo"

release_binaries mongoguard-standin mongoguard

P0="$(pick_port "${STANDIN_PORT:-}" 27400)"
for p in "$P0" $((P0 + 1)) $((P0 + 2)); do
    port_in_use "$p" && die "stand-in port $p is in use (set STANDIN_PORT)"
    PICKED+=("$p")
done
PT="$(pick_port "${PASSTHROUGH_PORT:-}" 27410)"
PICKED+=("$PT")
PQ="$(pick_port "${POOLED_PORT:-}" 27411)"
PICKED+=("$PQ")
RS_URI="mongodb://127.0.0.1:$P0,127.0.0.1:$((P0 + 1)),127.0.0.1:$((P0 + 2))/?replicaSet=rs0"
log "ports: stand-in $P0-$((P0 + 2)), passthrough $PT, pooled $PQ"

EV="$SOAK_DIR/events.jsonl"
: >"$EV"
now() { date +%s.%N; }
event() { # event KIND [extra JSON fields]: one line in events.jsonl, now
    printf '{"t": %s, "kind": "%s"%s}\n' "$(now)" "$1" "${2:+, $2}" >>"$EV"
}

# --- stand-in replica set (restartable) ----------------------------------------
STANDIN_STARTS=0
STANDIN_PID=""
start_standin() {
    STANDIN_STARTS=$((STANDIN_STARTS + 1))
    local logf="$SOAK_DIR/standin-$STANDIN_STARTS.log"
    "$BIN/mongoguard-standin" --listen "127.0.0.1:$P0" --replica-set rs0 --members 3 \
        --user "$APP_USER:$APP_PASSWORD" >"$logf" 2>&1 &
    STANDIN_PID=$!
    PIDS+=("$STANDIN_PID")
    wait_for_line "$logf" "mongoguard-standin replica set rs0 uri $RS_URI" "$STANDIN_PID" standin
}
start_standin

# --- mongoguard, both modes ----------------------------------------------------
"$BIN/mongoguard" --admin-listen off --listen "127.0.0.1:$PT" --upstream "$RS_URI" \
    >"$SOAK_DIR/passthrough.log" 2>&1 &
PASSTHROUGH_PID=$!
PIDS+=("$PASSTHROUGH_PID")
wait_for_port "$PT" "$PASSTHROUGH_PID" passthrough || die "passthrough mongoguard did not start"

USERS="$SOAK_DIR/users.toml"
rm -f "$USERS"
printf '%s' "$APP_PASSWORD" | "$BIN/mongoguard" users add --file "$USERS" "$APP_USER" >"$SOAK_DIR/users-add.log" 2>&1 ||
    die "mongoguard users add failed (see $SOAK_DIR/users-add.log)"
cat >"$SOAK_DIR/pooled.toml" <<TOML
[proxy]
listen = "127.0.0.1:$PQ"
mode = "pooled"

[upstream]
uri = "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$P0,127.0.0.1:$((P0 + 1)),127.0.0.1:$((P0 + 2))/?replicaSet=rs0&authSource=admin"

[pool]
pool_size = $POOL_SIZE

[auth]
users_file = "$USERS"
TOML
"$BIN/mongoguard" --admin-listen off --config "$SOAK_DIR/pooled.toml" >"$SOAK_DIR/pooled.log" 2>&1 &
POOLED_PID=$!
PIDS+=("$POOLED_PID")
wait_for_port "$PQ" "$POOLED_PID" pooled || die "pooled mongoguard did not start"

# --- drivers -----------------------------------------------------------------
declare -A DRIVER_PID
for t in passthrough pooled; do
    port="$PT"
    [[ $t == pooled ]] && port="$PQ"
    "$PY" bench/soak/driver.py --uri "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$port/?authSource=admin" \
        --name "$t" --ledger "$SOAK_DIR/ledger-$t.tsv" --writers "$WRITERS" --readers "$READERS" \
        --rate "$RATE" >"$SOAK_DIR/driver-$t.log" 2>&1 &
    DRIVER_PID[$t]=$!
    PIDS+=("$!")
done

rss_of() { awk '/^VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null || echo ""; }
printf 't\tminute\tpassthrough\tpooled\n' >"$SOAK_DIR/rss.tsv"
sample_rss() {
    printf '%s\t%s\t%s\t%s\n' "$(now)" "$1" "$(rss_of "$PASSTHROUGH_PID")" "$(rss_of "$POOLED_PID")" >>"$SOAK_DIR/rss.tsv"
}

do_event() {
    case "$1" in
        stepdown)
            log "event: stepdown"
            "$PY" bench/soak/check.py stepdown --uri "mongodb://127.0.0.1:$P0" --gap-ms "$STEPDOWN_GAP_MS" \
                --event-log "$EV" >>"$SOAK_DIR/events.log" 2>&1 || log "stepdown failed (see events.log)"
            ;;
        kill)
            log "event: snapshot, kill -9 the stand-in, restart after ${RESTART_GAP}s"
            "$PY" bench/soak/check.py snapshot --uri "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$P0/?authSource=admin" \
                --coll ledger_passthrough --coll ledger_pooled --out "$SOAK_DIR/snap-$((STANDIN_STARTS - 1)).json" \
                --event-log "$EV" >>"$SOAK_DIR/events.log" 2>&1 || die "snapshot before kill failed (see events.log)"
            kill -9 "$STANDIN_PID"
            wait "$STANDIN_PID" 2>/dev/null || true
            event kill
            sleep "$RESTART_GAP"
            event restart
            start_standin
            ;;
        *) die "unknown event $1 (stepdown, kill)" ;;
    esac
}

# --- schedule ------------------------------------------------------------------
IFS=',' read -r -a EV_CYCLE <<<"$EVENTS"
event start "\"soak_minutes\": $SOAK_MINUTES, \"event_interval\": $EVENT_INTERVAL"
START="$(date +%s)"
END=$((START + SOAK_MINUTES * 60))
NEXT_RSS=$START
NEXT_EVENT=$((START + EVENT_INTERVAL))
N_EVENT=0
MINUTE=0
FAILURES=()
log "soak: $SOAK_MINUTES min, events every ${EVENT_INTERVAL}s ($EVENTS)"
while (($(date +%s) < END)); do
    now_s="$(date +%s)"
    if ((now_s >= NEXT_RSS)); then
        sample_rss "$MINUTE"
        log "minute $MINUTE: RSS passthrough $(rss_of "$PASSTHROUGH_PID") KiB, pooled $(rss_of "$POOLED_PID") KiB"
        MINUTE=$((MINUTE + 1))
        NEXT_RSS=$((NEXT_RSS + 60))
    fi
    if ((now_s >= NEXT_EVENT)); then
        do_event "${EV_CYCLE[$((N_EVENT % ${#EV_CYCLE[@]}))]}"
        N_EVENT=$((N_EVENT + 1))
        NEXT_EVENT=$((NEXT_EVENT + EVENT_INTERVAL))
    fi
    for name in PASSTHROUGH POOLED; do
        pid_var="${name}_PID"
        kill -0 "${!pid_var}" 2>/dev/null || {
            FAILURES+=("${name,,} mongoguard died (see $SOAK_DIR/${name,,}.log)")
            break 2
        }
    done
    for t in passthrough pooled; do
        kill -0 "${DRIVER_PID[$t]}" 2>/dev/null || {
            FAILURES+=("the $t driver exited early (see $SOAK_DIR/driver-$t.log)")
            break 2
        }
    done
    sleep 1
done
sample_rss "$MINUTE"

# --- stop the drivers, final snapshot, check -------------------------------------
log "stopping the drivers"
event stop
for t in passthrough pooled; do
    kill -TERM "${DRIVER_PID[$t]}" 2>/dev/null || true
done
for t in passthrough pooled; do
    for ((i = 0; i < 600; i++)); do
        kill -0 "${DRIVER_PID[$t]}" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "${DRIVER_PID[$t]}" 2>/dev/null; then
        kill -9 "${DRIVER_PID[$t]}" 2>/dev/null || true
        FAILURES+=("the $t driver did not stop within 60 s (ledger may be incomplete)")
    fi
    wait "${DRIVER_PID[$t]}" || FAILURES+=("the $t driver exited non-zero (see $SOAK_DIR/driver-$t.log)")
done
"$PY" bench/soak/check.py snapshot --uri "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$P0/?authSource=admin" \
    --coll ledger_passthrough --coll ledger_pooled --out "$SOAK_DIR/snap-$((STANDIN_STARTS - 1)).json" \
    --event-log "$EV" --kind final-snapshot >>"$SOAK_DIR/events.log" 2>&1 || die "final snapshot failed (see events.log)"
for name in PASSTHROUGH POOLED; do
    pid_var="${name}_PID"
    kill -0 "${!pid_var}" 2>/dev/null || FAILURES+=("${name,,} mongoguard is not running at the end")
done

set +e
{
    echo "# Soak run $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo ""
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
    echo "- command: \`SOAK_MINUTES=$SOAK_MINUTES EVENT_INTERVAL=$EVENT_INTERVAL EVENTS=$EVENTS WRITERS=$WRITERS READERS=$READERS RATE=$RATE RESUME_LIMIT=$RESUME_LIMIT bench/soak.sh\`"
    echo "- stand-in: 3 members, one process, restarted $((STANDIN_STARTS - 1)) times; pooled pool_size = $POOL_SIZE; pymongo $("$PY" -c 'import pymongo; print(pymongo.version)')"
    echo ""
    "$PY" bench/soak/check.py check --run-dir "$SOAK_DIR" --target passthrough=ledger_passthrough \
        --target pooled=ledger_pooled --warmup-min "$WARMUP_MIN" --resume-limit "$RESUME_LIMIT"
    echo "check exit status: $?" >"$SOAK_DIR/check.rc"
    echo ""
    for t in passthrough pooled; do
        echo "- $t driver, last progress line: \`$(grep -v '^$' "$SOAK_DIR/driver-$t.log" | tail -n1)\`"
    done
    for f in "${FAILURES[@]}"; do
        echo "- FAILURE: $f"
    done
} >"$SOAK_DIR/report.md" 2>&1
set -e
cat "$SOAK_DIR/report.md"
CHECK_RC="$(sed 's/.*: //' "$SOAK_DIR/check.rc")"
log "report: $SOAK_DIR/report.md"
if [[ "$CHECK_RC" != 0 || ${#FAILURES[@]} -gt 0 ]]; then
    log "soak FAILED (check exit $CHECK_RC: see LEDGER and RESUME in the report; ${#FAILURES[@]} other failures)"
    exit 1
fi
log "soak passed"
