# shellcheck shell=bash
# Shared by run_local.sh and run.sh (sourced, not executed).
#
# setup_python: sets $PY to a python that has integration/python/requirements.txt installed.
#   1. a virtualenv at $MONGOGUARD_VENV (default integration/.venv), created if needed;
#   2. if `python3 -m venv` is unavailable (Debian without python3-venv) and we are root with
#      apt-get, installs python3-venv and retries;
#   3. otherwise falls back to `pip install --user` into the system python3.

INTEGRATION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$INTEGRATION_DIR/.." && pwd)"
REQUIREMENTS="$INTEGRATION_DIR/python/requirements.txt"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

_pip_install() {
    # $1: python; rest: extra pip args
    local py="$1"
    shift
    "$py" -m pip install --disable-pip-version-check -q "$@" -r "$REQUIREMENTS"
}

setup_python() {
    local venv="${MONGOGUARD_VENV:-$INTEGRATION_DIR/.venv}"
    local stamp="$venv/.requirements.sha256"
    local want
    want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"

    if [ ! -x "$venv/bin/python" ]; then
        log "creating virtualenv $venv"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" 2>/dev/null; then
            rm -rf "$venv"
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                log "python3 -m venv failed; installing python3-venv with apt-get"
                local pyver
                pyver="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
                (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                    python3-venv "python${pyver}-venv") >/dev/null 2>&1 ||
                    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null 2>&1 ||
                    true
                python3 -m venv "$venv" 2>/dev/null || rm -rf "$venv"
            fi
        fi
    fi

    if [ -x "$venv/bin/python" ]; then
        PY="$venv/bin/python"
        if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
            log "installing $REQUIREMENTS into $venv"
            "$PY" -m pip install --disable-pip-version-check -q --upgrade pip >/dev/null 2>&1 || true
            _pip_install "$PY"
            echo "$want" >"$stamp"
        fi
    else
        log "no virtualenv available; installing requirements with pip --user"
        PY="$(command -v python3)"
        # PEP 668 (Debian's externally managed python) needs the override for --user installs.
        PIP_BREAK_SYSTEM_PACKAGES=1 _pip_install "$PY" --user
    fi
    export PY
    log "python: $PY ($("$PY" -c 'import pymongo, sys; print("pymongo", pymongo.version, "python", sys.version.split()[0])'))"
}

# wait_tcp HOST PORT ATTEMPTS: true once HOST:PORT accepts a TCP connection (0.5 s between tries).
wait_tcp() {
    local host="$1" port="$2" attempts="${3:-120}" i
    for ((i = 0; i < attempts; i++)); do
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

# free_port: prints a TCP port that is free on 127.0.0.1 right now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# cargo_target_dir: the workspace's target directory (honours CARGO_TARGET_DIR and config).
cargo_target_dir() {
    (cd "$REPO_DIR" && cargo metadata --format-version 1 --no-deps 2>/dev/null) |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null ||
        echo "${CARGO_TARGET_DIR:-$REPO_DIR/target}"
}

# build_binaries: builds mongoguard and mongoguard-standin with CARGO_PROFILE (default debug)
# and sets bin_dir to where they are; MONGOGUARD_BIN_DIR uses prebuilt ones instead.
build_binaries() {
    if [ -n "${MONGOGUARD_BIN_DIR:-}" ]; then
        bin_dir="$MONGOGUARD_BIN_DIR"
        log "using prebuilt binaries in $bin_dir"
        return
    fi
    local profile="${CARGO_PROFILE:-debug}" profile_dir
    local -a profile_args
    case "$profile" in
        debug | dev) profile_args=(--profile dev) profile_dir=debug ;;
        *) profile_args=(--profile "$profile") profile_dir="$profile" ;;
    esac
    log "building mongoguard and mongoguard-standin ($profile_dir)"
    (cd "$REPO_DIR" && cargo build "${profile_args[@]}" -p mongoguard --bin mongoguard \
        -p mongoguard-standin --bin mongoguard-standin)
    bin_dir="$(cargo_target_dir)/$profile_dir"
}
