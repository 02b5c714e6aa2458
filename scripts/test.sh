#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, every Rust test (unit, property,
# wire-level proxy tests, the stand-in's own tests, the Rust driver through the proxy), then
# the pymongo suite through the proxy, then pooled mode with PHP-FPM and pymongo. Installs what
# it needs (Python packages into integration/.venv; php-fpm, php-mongodb and libfcgi-bin with
# apt-get as root). Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n=== %s ===\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (workspace)"
cargo test --workspace

step "the profile-guided build pipeline (scripts/build-pgo.sh; pgo-check profile, short training)"
# llvm-profdata comes from rustup's llvm-tools component (rustup's own server, not a cargo
# registry): where it cannot be installed, the step says so and is skipped.
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
if [[ -x "$PROFDATA" ]] || rustup component add llvm-tools; then
    # The pipeline is checked, not the optimised binary: an opt-level 1 profile
    # (Cargo.toml, `pgo-check`) and debug-built training tools, which `cargo test` built.
    PGO_CARGO_PROFILE=pgo-check PGO_TOOLS_PROFILE=dev PGO_SECONDS=0.3 \
        PGO_OUT=target/pgo-ci/mongoguard \
        bash scripts/build-pgo.sh
else
    echo "SKIPPED: rustup could not install llvm-tools (llvm-profdata); the PGO pipeline was not run"
fi

step "pymongo through mongoguard (integration/run_local.sh)"
bash integration/run_local.sh

step "pooled mode: PHP-FPM (php-mongodb) and pymongo, unsharded and sharded pool with send-ahead (integration/run_pooled.sh)"
bash integration/run_pooled.sh

step "the Node.js driver: passthrough, guard, pooled (integration/run_node.sh)"
bash integration/run_node.sh

step "the Go driver, the Java driver 3.6, mongosh and mgo (legacy OP_QUERY), both modes (integration/run_sdks.sh)"
bash integration/run_sdks.sh

step "status page in headless Chromium: mock states, then a live mongoguard under traffic"
bash integration/status/run.sh
bash integration/status/run_live.sh
