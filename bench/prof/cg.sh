#!/usr/bin/env bash
# cg.sh BIN PORT OP CONC [DUR]: user-space instructions per request of BIN (mongoguard, or
# anything taking mongoguard's --listen/--upstream flags; or haproxy, given a TCP-mode config
# here) under callgrind, against the stand-in on :27300 (up.sh; stop mongoguard on PORT first).
# Warms up for 1 s, zeroes the counters, measures a DUR-second loadgen run, divides. Extra
# flags for BIN in MG_ARGS. CACHE=1 adds callgrind's cache simulation (32 KiB L1 instruction
# and data caches, this CPU's 1 MiB L2 as the last level) and prints every counter per
# request: instructions, data reads and writes, L1 and last-level misses (docs/performance.md,
# "Eighth pass").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
mkdir -p "$P"
bin=$1; port=$2; op=${3:-find}; c=${4:-8}; d=${5:-3}
L="$B/loadgen"
rm -f "$P"/cg.out.*
VG=(valgrind --tool=callgrind --callgrind-out-file="$P/cg.out.%p")
[[ "${CACHE:-0}" != 1 ]] || VG+=(--cache-sim=yes --LL=1048576,16,64)
if [[ "$(basename "$bin")" == haproxy ]]; then
    printf '%s\n' global '    maxconn 4096' defaults '    mode tcp' '    timeout connect 5s' \
        '    timeout client 1h' '    timeout server 1h' 'listen mongo' "    bind 127.0.0.1:$port" \
        '    server standin 127.0.0.1:27300' > "$P/cg-haproxy.cfg"
    "${VG[@]}" "$bin" -db -f "$P/cg-haproxy.cfg" > "$P/cg.log" 2>&1 &
else
    # shellcheck disable=SC2086 # MG_ARGS is a list of extra flags
    RUST_LOG=warn "${VG[@]}" "$bin" --admin-listen off \
        --listen "127.0.0.1:$port" --upstream mongodb://127.0.0.1:27300 ${MG_ARGS:-} > "$P/cg.log" 2>&1 &
fi
vpid=$!
for _ in $(seq 60); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.5; done
"$L" --target "w=127.0.0.1:$port" --op "$op" --concurrency "$c" --duration 1 --warmup 0 --docs 10000 \
    --no-setup --first-insert-id $((RANDOM * 100000 + 1000000)) > /dev/null 2>&1
callgrind_control -z "$vpid" > /dev/null 2>&1
n=$("$L" --target "w=127.0.0.1:$port" --op "$op" --concurrency "$c" --duration "$d" --warmup 0 --docs 10000 \
    --no-setup --first-insert-id $((RANDOM * 100000 + 2000000)) --json 2>/dev/null |
    python3 -c "import sys, json; print(json.load(sys.stdin)['results'][0]['ops_total'])")
callgrind_control -d "$vpid" > /dev/null 2>&1
sleep 1
kill "$vpid"; wait "$vpid" 2>/dev/null
# Every counter of every dump (one file per thread for some programs), per request.
python3 - "$(basename "$bin") $op x$c" "$n" "$P"/cg.out.* <<'PY'
import sys
label, n, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names, total = None, None
for f in files:
    for line in open(f):
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("summary:"):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (len(names) - len(v))
            total = v if total is None else [a + b for a, b in zip(total, v)]
per = " ".join(f"{k}/req={t / n:.1f}" for k, t in zip(names, total))
print(f"{label}: requests={n} Ir_total={total[0]} {per}")
PY
echo "profile: $(ls "$P"/cg.out.*) (callgrind_annotate --inclusive=yes)"
