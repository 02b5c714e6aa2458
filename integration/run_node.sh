#!/usr/bin/env bash
# Runs the Node.js driver suite (integration/node: the official `mongodb` npm package, node:test)
# against mongoguard in front of mongoguard-standin, on free loopback ports, without Docker and
# without a real mongod. Exits with node --test's status.
#
#   bash integration/run_node.sh [extra node --test options, e.g. --test-reporter=tap]
#
# It starts:
#   1. a stand-in without users + mongoguard in passthrough mode (test/drivers.test.mjs and
#      test/guard.test.mjs);
#   2. a stand-in with a user + mongoguard in pooled mode (pool_size $POOL_SIZE, a users file
#      made with `mongoguard users add`) (test/pooled.test.mjs).
#
# Environment:
#   CARGO_PROFILE       cargo profile to build and run (default: debug; e.g. release)
#   CARGO_TARGET_DIR    honoured (through cargo metadata)
#   MONGOGUARD_BIN_DIR  use the mongoguard and mongoguard-standin binaries in this directory
#                       instead of building
#   POOL_SIZE           the pooled mongoguard's [pool] pool_size (default 4)
#   CI=true             a suite whose environment is missing fails instead of skipping
# Needs node >= 20 and npm (`npm ci` installs integration/node/package-lock.json).
set -euo pipefail

# shellcheck source=integration/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODE_DIR="$INTEGRATION_DIR/node"
pool_size="${POOL_SIZE:-4}"

command -v node >/dev/null 2>&1 || {
    log "node is not installed (Node.js >= 20 is needed)"
    exit 1
}
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
    log "node $(node --version) is too old: the suite needs Node.js >= 20 (node:test)"
    exit 1
fi

# ---- dependencies: npm ci, skipped while package-lock.json is unchanged -------------------
npm_ci "$NODE_DIR"
log "node $(node --version), mongodb driver $(node -p "require('$NODE_DIR/node_modules/mongodb/package.json').version")"

# ---- binaries --------------------------------------------------------------------------
build_binaries

stack_init node

# ---- 1. passthrough ----------------------------------------------------------------------

start_standin standin
plain_addr="$STANDIN_ADDR"
proxy_port="$(free_port)"
start_mongoguard mongoguard "$proxy_port" --listen "127.0.0.1:$proxy_port" \
    --upstream "mongodb://$plain_addr"

# ---- 2. pooled -------------------------------------------------------------------------
# The pooled suite counts upstream connections and authentications against pool_size: the
# plan guard's own explain connection would be one more (it has its own tests).
pooled_extra_toml='[plan]
enabled = "off"' start_pooled nodeuser

# ---- node --test -------------------------------------------------------------------------
status=0
(
    cd "$REPO_DIR"
    MONGOGUARD_PROXY_URI="mongodb://127.0.0.1:$proxy_port" \
        MONGOGUARD_DIRECT_URI="mongodb://$plain_addr" \
        MONGOGUARD_POOLED_ADDR="127.0.0.1:$pooled_port" \
        MONGOGUARD_POOLED_USER="$client_user" \
        MONGOGUARD_POOLED_PASSWORD="$client_password" \
        MONGOGUARD_STANDIN_ADDR="$pooled_standin_addr" \
        MONGOGUARD_STANDIN_URI="$pooled_standin_uri" \
        MONGOGUARD_POOL_SIZE="$pool_size" \
        node --test --test-reporter=spec "$@" integration/node/test/
) || status=$?

if [ "$status" != 0 ]; then
    show_logs
fi
log "node --test: exit $status"
exit "$status"
