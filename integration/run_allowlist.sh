#!/usr/bin/env bash
# The learned allowlist's workflow with pymongo (integration/allowlist.py), against the
# stand-in, on free loopback ports:
#   1. staging: mongoguard with [allowlist] mode = "learn"; the application "billing" sends
#      its queries; mongoguard is stopped (SIGTERM), which writes the allowlist file;
#   2. review: the file exists and lists billing's shapes (what a pull request shows);
#   3. production: mongoguard with mode = "enforce" and a policy where A001 blocks: the learned
#      shapes pass, an injection-shaped query and an unknown application are refused.
# Run by integration/run_local.sh after the pytest suite; can run alone:
#
#   bash integration/run_allowlist.sh
#
# Environment: CARGO_PROFILE, MONGOGUARD_BIN_DIR, MONGOGUARD_VENV (see common.sh).
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_binaries
setup_python
stack_init allowlist

start_standin standin
allowlist="$work/allowlist.toml"
cat >"$work/policy.toml" <<TOML
extends = "standard"
[rules]
A001 = "block"
TOML

# mongoguard_config MODE PORT: a configuration file for one step.
mongoguard_config() {
    cat >"$work/mongoguard-$1.toml" <<TOML
[proxy]
listen = "127.0.0.1:$2"
[upstream]
uri = "mongodb://$STANDIN_ADDR"
[policy]
file = "$work/policy.toml"
[audit]
sink = "file:$work/violations-$1.jsonl"
[allowlist]
mode = "$1"
file = "$allowlist"
TOML
}

# ---- 1. staging: learn --------------------------------------------------------------------
port="$(free_port)"
mongoguard_config learn "$port"
start_mongoguard staging "$port" --config "$work/mongoguard-learn.toml"
staging_pid="${pids[-1]}"
"$PY" "$INTEGRATION_DIR/allowlist.py" learn "mongodb://127.0.0.1:$port" ||
    fail "allowlist.py learn"
kill -TERM "$staging_pid"
wait "$staging_pid" || true
[ -f "$allowlist" ] || fail "learn mode wrote no allowlist file at shutdown"

# ---- 2. review ----------------------------------------------------------------------------
log "---- $allowlist ----"
cat "$allowlist" >&2
"$PY" "$INTEGRATION_DIR/allowlist.py" review "$allowlist" || fail "allowlist.py review"

# ---- 3. production: enforce ---------------------------------------------------------------
port="$(free_port)"
mongoguard_config enforce "$port"
start_mongoguard production "$port" --config "$work/mongoguard-enforce.toml"
production_pid="${pids[-1]}"
"$PY" "$INTEGRATION_DIR/allowlist.py" enforce "mongodb://127.0.0.1:$port" ||
    fail "allowlist.py enforce"
kill -TERM "$production_pid"
wait "$production_pid" || true
# The violation records carry the new shape, without its literals.
grep -q '"rule":"A001".*"filter_shape":{"password":{"$ne":"<null>"}}' \
    "$work/violations-enforce.jsonl" ||
    fail "no A001 record with the injection's shape: $(cat "$work/violations-enforce.jsonl")"
log "A001 records: $(grep -c '"rule":"A001"' "$work/violations-enforce.jsonl")"
log "allowlist workflow (learn, review, enforce): passed"
