#!/usr/bin/env bash
# Starts the three targets the profiling scripts measure, from release binaries
# (cargo build --release --workspace first): the stand-in on :27300, mongoguard on :27301
# (extra flags in MG_ARGS), HAProxy (TCP mode) on :27302. PIDs go to $PROF_DIR/NAME.pid for
# cpu.sh (names: standin, mg, haproxy). Seed the stand-in before a find run:
#   target/release/loadgen --target s=127.0.0.1:27300 --op find --concurrency 1 --duration 1 --warmup 0 --docs 10000
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${BIN_DIR:-$ROOT/target/release}"
P="${PROF_DIR:-/tmp/mongoguard-prof}"
mkdir -p "$P"
pkill -f "listen 127.0.0.1:2730" ; pkill -f "haproxy -db -f $P/haproxy.cfg"; sleep 0.3
RUST_LOG=warn "$B/mongoguard-standin" --listen 127.0.0.1:27300 > "$P/standin.log" 2>&1 &
echo $! > "$P/standin.pid"
sleep 0.3
"$B/mongoguard" --admin-listen off --listen 127.0.0.1:27301 --upstream mongodb://127.0.0.1:27300 ${MG_ARGS:-} > "$P/mg.log" 2>&1 &
echo $! > "$P/mg.pid"
cat > "$P/haproxy.cfg" <<H
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
listen mongo
    bind 127.0.0.1:27302
    server standin 127.0.0.1:27300
H
haproxy -db -f "$P/haproxy.cfg" > "$P/haproxy.log" 2>&1 &
echo $! > "$P/haproxy.pid"
sleep 0.5
