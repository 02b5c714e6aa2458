#!/usr/bin/env bash
# pooled.sh: pooled mode against passthrough, one at a time, against the stand-in on :27300
# (up.sh, seeded): for each op in OPS [find], a pooled mongoguard (:27330, pool_size
# POOL_SIZE [20], unauthenticated clients, TOKIO_WORKER_THREADS TW [2]) then a passthrough one
# (:27301, proxy.threads PT [2]), each measured by cpu.sh at CONC [64] clients for DUR [4] s.
# Stop up.sh's mongoguard on :27301 first. ROUNDS [1] repeats the whole sequence (even
# rounds in reverse order); each line
# ends with the share of the machine's CPU time left idle during the run (/proc/stat): near
# 0 means CPU, not the pool, limits throughput. BIN_OLD: a second mongoguard binary measured
# as "pooled-old" (:27331) beside "pooled" in each round, for before/after comparisons.
# At the end, bench/prof/pooled_summary.py prints each mode's ratios against passthrough and
# their medians (ops/s, mongoguard's CPU per request, the three processes' CPU per request).
# WS=1 adds "pass-ws": passthrough on the work-stealing runtime (`proxy.work_stealing`,
# TOKIO_WORKER_THREADS TW), the runtime pooled sessions run on (docs/performance.md, "Tenth
# pass": its idle share).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
mkdir -p "$P"
printf '[proxy]\nlisten = "127.0.0.1:27330"\nmode = "pooled"\nmax_client_connections = 20000\n[upstream]\nuri = "mongodb://127.0.0.1:27300"\n[auth]\nallow_unauthenticated = true\n[pool]\npool_size = %s\n' \
    "${POOL_SIZE:-20}" > "$P/pooled.toml"
printf '[proxy]\nlisten = "127.0.0.1:27301"\nthreads = %s\n[upstream]\nuri = "mongodb://127.0.0.1:27300"\n' \
    "${PT:-2}" > "$P/pass.toml"
sed 's/27330/27331/' "$P/pooled.toml" > "$P/pooled-old.toml"
printf '[proxy]\nlisten = "127.0.0.1:27301"\nwork_stealing = true\n[upstream]\nuri = "mongodb://127.0.0.1:27300"\n' \
    > "$P/pass-ws.toml"
: > "$P/pooled.lines"
idle() { awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
for round in $(seq "${ROUNDS:-1}"); do
for op in ${OPS:-find}; do
    # Odd rounds in one order, even rounds reversed: this machine's slow and fast phases
    # last several runs, and a fixed order would charge them to one mode.
    modes=(${BIN_OLD:+pooled-old} pooled pass)
    [[ "${WS:-0}" != 1 ]] || modes+=(pass-ws)
    if (( round % 2 == 0 )); then
        for ((i = 0, j = ${#modes[@]} - 1; i < j; i++, j--)); do
            t=${modes[i]}; modes[i]=${modes[j]}; modes[j]=$t
        done
    fi
    for mode in "${modes[@]}"; do
        if [ "$mode" = pooled-old ]; then
            TOKIO_WORKER_THREADS=${TW:-2} "$BIN_OLD" --admin-listen off --config "$P/pooled-old.toml" > "$P/pooled-old.log" 2>&1 &
            port=27331
        elif [ "$mode" = pooled ]; then
            TOKIO_WORKER_THREADS=${TW:-2} "$B/mongoguard" --admin-listen off --config "$P/pooled.toml" > "$P/pooled.log" 2>&1 &
            port=27330
        elif [ "$mode" = pass-ws ]; then
            TOKIO_WORKER_THREADS=${TW:-2} "$B/mongoguard" --admin-listen off --config "$P/pass-ws.toml" > "$P/pass-ws.log" 2>&1 &
            port=27301
        else
            "$B/mongoguard" --admin-listen off --config "$P/pass.toml" > "$P/pass.log" 2>&1 &
            port=27301
        fi
        echo $! > "$P/$mode.pid"
        sleep 0.5
        read -r i0 t0 < <(idle)
        line=$(bash "$ROOT/bench/prof/cpu.sh" "$mode" "$port" "$op" "${CONC:-64}" "${DUR:-4}")
        read -r i1 t1 < <(idle)
        echo "round $round: $line idle=$(awk -v a="$i0" -v b="$i1" -v c="$t0" -v d="$t1" 'BEGIN { printf "%.0f%%", 100 * (b - a) / (d - c) }')" | tee -a "$P/pooled.lines"
        kill "$(cat "$P/$mode.pid")"
        sleep 0.3
    done
done
done
# Ratios against passthrough per round, and their medians (bench/prof/pooled_summary.py).
python3 "$ROOT/bench/prof/pooled_summary.py" "$P/pooled.lines"
