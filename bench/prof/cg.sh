#!/usr/bin/env bash
# cg.sh BIN PORT OP CONC [DUR]: user-space instructions per request of BIN (mongoguard, or
# anything taking mongoguard's --listen/--upstream flags) under callgrind, against the
# stand-in on :27300 (up.sh; stop mongoguard on PORT first). Warms up for 1 s, zeroes the
# counters, measures a DUR-second loadgen run, divides. Extra flags for BIN in MG_ARGS.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
mkdir -p "$P"
bin=$1; port=$2; op=${3:-find}; c=${4:-8}; d=${5:-3}
L="$B/loadgen"
rm -f "$P"/cg.out.*
RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$P/cg.out.%p" "$bin" --admin-listen off \
    --listen "127.0.0.1:$port" --upstream mongodb://127.0.0.1:27300 ${MG_ARGS:-} > "$P/cg.log" 2>&1 &
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
ir=$(grep -h "^summary:" "$P"/cg.out.*.1 | awk '{s += $2} END {print s}')
echo "$(basename "$bin") $op x$c: requests=$n Ir_total=$ir Ir/req=$((ir / n))"
echo "profile: $(ls "$P"/cg.out.*.1) (callgrind_annotate --inclusive=yes)"
