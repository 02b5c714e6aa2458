#!/usr/bin/env bash
# cpu.sh NAME PORT OP CONC [DUR]: one closed-loop loadgen run against 127.0.0.1:PORT and the
# CPU time of process $PROF_DIR/NAME.pid over it (utime + stime from /proc/PID/stat), per
# request: prints ops/s, p50 and user / kernel / total µs per request. Interleave targets
# (one at a time) and compare ratios from the same rounds; the stand-in must be seeded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
n=$1; p=$2; op=$3; c=$4; d=${5:-4}
pid=$(cat "$P/$n.pid")
tick=$(getconf CLK_TCK)
read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
out=$("$B/loadgen" --target "$n=127.0.0.1:$p" --op "$op" --concurrency "$c" --duration "$d" --warmup 0 \
    --docs 10000 --no-setup --first-insert-id $((RANDOM * 100000 + 1000000)) --json 2>/dev/null)
read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
echo "$out" | python3 -c "
import sys, json
r = json.load(sys.stdin)['results'][0]
o = r['ops_total']; us = 1e6 / $tick
print('$n $op x$c: ops/s=%d p50=%s user=%.1f sys=%.1f total=%.1f us/req' % (
    r['ops_per_sec'], r['p50_us'], ($u1 - $u0) * us / o, ($s1 - $s0) * us / o,
    ($u1 - $u0 + $s1 - $s0) * us / o))"
