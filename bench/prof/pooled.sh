#!/usr/bin/env bash
# pooled.sh: pooled mode against passthrough, one at a time, against the stand-in on :27300
# (up.sh, seeded): for each op in OPS [find], a pooled mongoguard (:27330, pool_size
# POOL_SIZE [20], unauthenticated clients, TOKIO_WORKER_THREADS TW [2]) then a passthrough one
# (:27301, proxy.threads PT [2]), each measured by cpu.sh at CONC [64] clients for DUR [4] s.
# Stop up.sh's mongoguard on :27301 first.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
mkdir -p "$P"
printf '[proxy]\nlisten = "127.0.0.1:27330"\nmode = "pooled"\nmax_client_connections = 20000\n[upstream]\nuri = "mongodb://127.0.0.1:27300"\n[auth]\nallow_unauthenticated = true\n[pool]\npool_size = %s\n' \
    "${POOL_SIZE:-20}" > "$P/pooled.toml"
printf '[proxy]\nlisten = "127.0.0.1:27301"\nthreads = %s\n[upstream]\nuri = "mongodb://127.0.0.1:27300"\n' \
    "${PT:-2}" > "$P/pass.toml"
for op in ${OPS:-find}; do
    for mode in pooled pass; do
        if [ "$mode" = pooled ]; then
            TOKIO_WORKER_THREADS=${TW:-2} "$B/mongoguard" --admin-listen off --config "$P/pooled.toml" > "$P/pooled.log" 2>&1 &
            port=27330
        else
            "$B/mongoguard" --admin-listen off --config "$P/pass.toml" > "$P/pass.log" 2>&1 &
            port=27301
        fi
        echo $! > "$P/$mode.pid"
        sleep 0.5
        bash "$ROOT/bench/prof/cpu.sh" "$mode" "$port" "$op" "${CONC:-64}" "${DUR:-4}"
        kill "$(cat "$P/$mode.pid")"
        sleep 0.3
    done
done
