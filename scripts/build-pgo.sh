#!/usr/bin/env bash
# scripts/build-pgo.sh: builds mongoguard with profile-guided optimisation (PGO), the build
# the container image ships and bench/run.sh measures beside the plain one (PGO=1).
#
#   bash scripts/build-pgo.sh            # -> target/pgo/mongoguard
#
# 1. builds the stand-in and loadgen (plain release) and an instrumented mongoguard
#    (`-Cprofile-generate`, profile `dist`: fat LTO, one codegen unit);
# 2. runs a training workload through it against the stand-in: passthrough (every loadgen
#    operation, 1 and 16 clients, plain and zstd-compressed) and pooled mode (steady and
#    serverless, SCRAM-SHA-256), then stops it with SIGINT (the profile is written at exit);
# 3. merges the profile (llvm-profdata from rustup's llvm-tools, installed if missing) and
#    builds mongoguard again with `-Cprofile-use`, profile `dist`.
#
# The profile only steers code layout and inlining: the binary does what the plain build
# does (the whole test suite runs against the plain build; scripts/test.sh). What it buys
# is in docs/performance.md ("Eighth pass"). Training covers the benchmark's operations, so
# the gain on other traffic may be smaller; a site can train on its own traffic by running
# the instrumented binary (step 1, PGO_KEEP_GEN=1) in front of it instead of step 2.
#
# 4. checks the result: finds and inserts through it, a clean stop on SIGINT, and the policy
#    engine's verdicts (`mongoguard check`: a delete of every document blocks, a find by
#    `_id` passes).
#
# Environment: PGO_OUT [target/pgo/mongoguard]; PGO_SECONDS [2] per training point;
# PGO_PORT_BASE [27400] (five ports from it; busy ones are skipped); PGO_CARGO_PROFILE [dist]
# (the test suite checks the whole pipeline with `pgo-check`, an opt-level 1 profile much
# quicker to build); PGO_TOOLS_PROFILE [release], the cargo profile the stand-in and loadgen
# are built with (the test suite uses `dev`, which its own tests have already built).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BENCH_NAME=build-pgo.sh
# shellcheck source=../bench/common.sh
source "$ROOT/bench/common.sh"

OUT="${PGO_OUT:-$ROOT/target/pgo/mongoguard}"
SECONDS_PER_POINT="${PGO_SECONDS:-2}"
PROFILE="${PGO_CARGO_PROFILE:-dist}"
TARGET_ROOT="${CARGO_TARGET_DIR:-$ROOT/target}"
GEN_DIR="$TARGET_ROOT/pgo-gen"
USE_DIR="$TARGET_ROOT/pgo-use"
DATA="$WORK/profiles"
mkdir -p "$DATA"

command -v cargo >/dev/null || die "cargo is needed (https://rustup.rs)"
HOST="$(rustc -vV | sed -n 's/^host: //p')"
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata"
if [[ ! -x "$PROFDATA" ]]; then
    log "installing rustup's llvm-tools (llvm-profdata matching rustc's LLVM)"
    rustup component add llvm-tools
fi
[[ -x "$PROFDATA" ]] || die "no llvm-profdata at $PROFDATA"

TOOLS_PROFILE="${PGO_TOOLS_PROFILE:-release}"
log "building the training tools (stand-in, loadgen; profile $TOOLS_PROFILE)"
cargo build --profile "$TOOLS_PROFILE" --locked -p mongoguard-standin -p mongoguard-bench \
    --bin mongoguard-standin --bin loadgen
case "$TOOLS_PROFILE" in
    dev | test) TOOLS="$TARGET_ROOT/debug" ;;
    *) TOOLS="$TARGET_ROOT/$TOOLS_PROFILE" ;;
esac

log "building the instrumented mongoguard"
RUSTFLAGS="-Cprofile-generate=$DATA" CARGO_TARGET_DIR="$GEN_DIR" \
    cargo build --profile "$PROFILE" --locked -p mongoguard --bin mongoguard
GEN="$GEN_DIR/$PROFILE/mongoguard"

# --- training ------------------------------------------------------------------------------
PORT_S="$(pick_port "" "${PGO_PORT_BASE:-27400}")"
PICKED+=("$PORT_S")
PORT_P="$(pick_port "" $((PORT_S + 1)))"
PICKED+=("$PORT_P")
PORT_A="$(pick_port "" $((PORT_P + 1)))"
PICKED+=("$PORT_A")
PORT_Q="$(pick_port "" $((PORT_A + 1)))"
PICKED+=("$PORT_Q")
APP_USER=app
APP_PASSWORD=apppw

"$TOOLS/mongoguard-standin" --listen "127.0.0.1:$PORT_S" >"$WORK/standin.log" 2>&1 &
PIDS+=($!)
wait_for_line "$WORK/standin.log" "mongoguard-standin listening on 127.0.0.1:$PORT_S" "$!" standin
# A second stand-in that requires authentication, for pooled mode.
"$TOOLS/mongoguard-standin" --listen "127.0.0.1:$PORT_A" --user "$APP_USER:$APP_PASSWORD" \
    >"$WORK/standin-auth.log" 2>&1 &
PIDS+=($!)
wait_for_line "$WORK/standin-auth.log" "mongoguard-standin listening on 127.0.0.1:$PORT_A" "$!" standin-auth

# The instrumented binary writes one profile per process, at a clean exit.
export LLVM_PROFILE_FILE="$DATA/mongoguard-%p-%m.profraw"
"$GEN" --admin-listen off --listen "127.0.0.1:$PORT_P" --upstream "mongodb://127.0.0.1:$PORT_S" \
    >"$WORK/passthrough.log" 2>&1 &
GEN_P=$!
PIDS+=("$GEN_P")
wait_for_port "$PORT_P" "$GEN_P" passthrough || die "instrumented mongoguard did not start"

USERS="$WORK/users.toml"
printf '%s' "$APP_PASSWORD" | "$GEN" users add --file "$USERS" "$APP_USER" >"$WORK/users.log" 2>&1 ||
    die "mongoguard users add failed: $(tail -n1 "$WORK/users.log")"
cat >"$WORK/pooled.toml" <<TOML
[proxy]
listen = "127.0.0.1:$PORT_Q"
mode = "pooled"

[upstream]
uri = "mongodb://$APP_USER:$APP_PASSWORD@127.0.0.1:$PORT_A/?authSource=admin"

[auth]
users_file = "$USERS"
TOML
"$GEN" --admin-listen off --config "$WORK/pooled.toml" >"$WORK/pooled.log" 2>&1 &
GEN_Q=$!
PIDS+=("$GEN_Q")
wait_for_port "$PORT_Q" "$GEN_Q" pooled || die "instrumented pooled mongoguard did not start"
unset LLVM_PROFILE_FILE

run() {
    "$TOOLS/loadgen" --warmup 0 --docs 10000 --docs-1k 1000 \
        --first-insert-id $((RANDOM * 100000 + 1000000)) "$@" >>"$WORK/loadgen.log" 2>&1 ||
        die "training run failed: loadgen $* (see $WORK/loadgen.log)"
}
log "training: passthrough"
run --target "s=127.0.0.1:$PORT_S" --op find,find101,drain --concurrency 1 --duration 1 --setup-only
for op in mix find insert find101 drain insertmany update1000 ping; do
    for c in 1 16; do
        run --target "p=127.0.0.1:$PORT_P" --op "$op" --concurrency "$c" --no-setup \
            --duration "$SECONDS_PER_POINT"
    done
done
run --target "p=127.0.0.1:$PORT_P" --op mix --concurrency 16 --compress zstd --no-setup \
    --duration "$SECONDS_PER_POINT"
log "training: pooled"
run --target "a=127.0.0.1:$PORT_A" --op find --concurrency 1 --duration 1 --setup-only \
    --user "$APP_USER" --password "$APP_PASSWORD"
for op in mix find insert; do
    run --target "q=127.0.0.1:$PORT_Q" --op "$op" --concurrency 16 --no-setup \
        --duration "$SECONDS_PER_POINT" --user "$APP_USER" --password "$APP_PASSWORD"
done
run --target "q=127.0.0.1:$PORT_Q" --op ping --concurrency 4 --scenario serverless --no-setup \
    --duration "$SECONDS_PER_POINT" --user "$APP_USER" --password "$APP_PASSWORD"

for pid in "$GEN_P" "$GEN_Q"; do
    kill -INT "$pid"
done
for pid in "$GEN_P" "$GEN_Q"; do
    wait "$pid" || die "an instrumented mongoguard did not exit cleanly (its profile is lost)"
done
compgen -G "$DATA/*.profraw" >/dev/null || die "no profile was written to $DATA"
"$PROFDATA" merge -o "$DATA/merged.profdata" "$DATA"/*.profraw

log "building mongoguard with the profile"
RUSTFLAGS="-Cprofile-use=$DATA/merged.profdata" CARGO_TARGET_DIR="$USE_DIR" \
    cargo build --profile "$PROFILE" --locked -p mongoguard --bin mongoguard
BUILT="$USE_DIR/$PROFILE/mongoguard"

log "checking the optimised binary"
PORT_C="$(pick_port "" $((PORT_Q + 1)))"
PICKED+=("$PORT_C")
"$BUILT" --admin-listen off --listen "127.0.0.1:$PORT_C" --upstream "mongodb://127.0.0.1:$PORT_S" \
    >"$WORK/check.log" 2>&1 &
CHECK_PID=$!
PIDS+=("$CHECK_PID")
wait_for_port "$PORT_C" "$CHECK_PID" check || die "the optimised mongoguard did not start"
run --target "c=127.0.0.1:$PORT_C" --op find,insert --concurrency 2 --duration 1 --no-setup
"$TOOLS/loadgen" --target "c=127.0.0.1:$PORT_C" --op find --concurrency 1 --duration 1 --warmup 0 \
    --no-setup --json >"$WORK/check.json" 2>>"$WORK/loadgen.log" ||
    die "the optimised mongoguard failed a find (see $WORK/loadgen.log)"
grep -q '"errors": *0' "$WORK/check.json" || die "the optimised mongoguard answered a find with an error"
kill -INT "$CHECK_PID"
wait "$CHECK_PID" || die "the optimised mongoguard did not stop cleanly on SIGINT"
rc=0
printf '%s\n' '{"delete": "orders", "deletes": [{"q": {}, "limit": 0}], "$db": "shop"}' |
    "$BUILT" check - >"$WORK/check-policy.log" 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q W003 "$WORK/check-policy.log" ||
    die "the optimised mongoguard did not block a delete of every document (check exit $rc)"
printf '%s\n' '{"find": "orders", "filter": {"_id": 1}, "$db": "shop"}' |
    "$BUILT" check - >"$WORK/check-policy.log" 2>&1 ||
    die "the optimised mongoguard did not pass a find by _id"

mkdir -p "$(dirname "$OUT")"
install -m 0755 "$BUILT" "$OUT"
[[ "${PGO_KEEP_GEN:-0}" == 1 ]] || rm -rf "$GEN_DIR"
log "built $OUT"
