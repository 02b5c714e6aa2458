#!/usr/bin/env bash
# A short run of every cargo-fuzz target (for developers; CI runs the same logic over the seeds
# and regression inputs as `cargo test --lib fuzz_logic`).
#
#   scripts/fuzz_smoke.sh                 # every target, 30 s each
#   FUZZ_SECONDS=120 scripts/fuzz_smoke.sh command_policy scram_server
#
# Installs cargo-fuzz if it is missing. Builds with debug assertions (integer overflow is a
# finding) and, by default, without a sanitizer (mongoguard forbids unsafe code; set
# FUZZ_SANITIZER=address to use AddressSanitizer). On a stable toolchain RUSTC_BOOTSTRAP=1
# unlocks the flags cargo-fuzz passes. Each target starts from its seeds and its fixed
# regression inputs (not the `open-*` ones, which are known to fail) in a throw-away corpus.
# Exits non-zero on the first target that finds a crash; the input is left in
# fuzz/artifacts/<target>/.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here/fuzz"
seconds="${FUZZ_SECONDS:-30}"
sanitizer="${FUZZ_SANITIZER:-none}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build --sanitizer "$sanitizer" --debug-assertions
# Run the built binaries directly: `cargo fuzz run` passes other profile settings than
# `cargo fuzz build` and recompiled the whole crate before every target.
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
    corpus="$work/$t"
    mkdir -p "$corpus" "artifacts/$t"
    cp seeds/"$t"/* "$corpus"/
    if [ -d "regressions/$t" ]; then
        find "regressions/$t" -type f ! -name 'open-*' -exec cp {} "$corpus"/ \;
    fi
    echo "== $t: ${seconds}s"
    status=0
    "$bin/$t" "$corpus" -artifact_prefix="artifacts/$t/" -max_total_time="$seconds" \
        -rss_limit_mb=2048 -print_final_stats=1 >"$work/$t.log" 2>&1 || status=$?
    grep -E '^(#[0-9]+ *DONE|Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|SUMMARY|thread .* panicked|==[0-9]+==)' \
        "$work/$t.log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$work/$t.log" >&2
        echo "$t: crash (exit $status); the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
done
