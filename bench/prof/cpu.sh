#!/usr/bin/env bash
# cpu.sh NAME PORT OP CONC [DUR]: one closed-loop loadgen run against 127.0.0.1:PORT and the
# CPU time of process $PROF_DIR/NAME.pid over it (utime + stime from /proc/PID/stat), per
# request: prints ops/s, p50 and user / kernel / total µs per request. Interleave targets
# (one at a time) and compare ratios from the same rounds; the stand-in must be seeded.
# Also the CPU per request of the upstream ($PROF_DIR/standin.pid, when it runs) and of
# loadgen itself: on a shared machine the three compete for the same cores, and a change
# in how the proxy uses its upstream (fewer connections, pooled) changes the upstream's cost.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
n=$1; p=$2; op=$3; c=$4; d=${5:-4}
pid=$(cat "$P/$n.pid")
tick=$(getconf CLK_TCK)
cpu() { if [ -r "/proc/$1/stat" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
# Context switches (voluntary and not) of every thread of a process.
cs() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'; }
spid=$(cat "$P/standin.pid" 2>/dev/null || echo none)
# Inserts go to a collection of their own, dropped (on the stand-in, :27300) before each run:
# the stand-in keeps every document in memory, and a collection grown by many runs (4 GB
# after 24 minutes of rounds) stalls it for seconds at a time.
coll=bench
if [ "$op" = insert ]; then
    coll=bench_insert
    "$B/loadgen" --target "s=127.0.0.1:27300" --coll "$coll" --setup-only --docs 0 > /dev/null 2>&1
fi
read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
up0=$(cpu "$spid")
cs0=$(cs "$pid"); ucs0=$(cs "$spid")
out=$("$B/loadgen" --target "$n=127.0.0.1:$p" --op "$op" --concurrency "$c" --duration "$d" --warmup 0 \
    --coll "$coll" --docs 10000 --no-setup --first-insert-id $((RANDOM * 100000 + 1000000)) --json 2>/dev/null)
read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
up1=$(cpu "$spid")
cs1=$(cs "$pid"); ucs1=$(cs "$spid")
# This shell's children's user and system seconds (loadgen's; the few short commands before
# it are noise). `times` runs in this shell: in a pipeline it would count a subshell's.
times > "$P/times.$$"
lg=$(tail -n1 "$P/times.$$" | awk '{ gsub(/[ms]/, " "); print ($1 * 60 + $2) + ($3 * 60 + $4) }')
rm -f "$P/times.$$"
echo "$out" | python3 -c "
import sys, json
r = json.load(sys.stdin)['results'][0]
o = r['ops_total']; us = 1e6 / $tick
print('$n $op x$c: ops/s=%d p50=%s user=%.1f sys=%.1f total=%.1f us/req upstream=%.1f loadgen=%.1f cs/req=%.3f upstream-cs/req=%.3f' % (
    r['ops_per_sec'], r['p50_us'], ($u1 - $u0) * us / o, ($s1 - $s0) * us / o,
    ($u1 - $u0 + $s1 - $s0) * us / o, ($up1 - $up0) * us / o, $lg * 1e6 / o,
    ($cs1 - $cs0) / o, ($ucs1 - $ucs0) / o))"
