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

# ---------------------------------------------------------------------------------------------
# A stand-in + mongoguard stack for the driver suites (run_node.sh, run_sdks.sh).
# stack_init NAME: a work directory ($work) removed on exit, with every process started by
# start_standin / start_mongoguard killed; `fail MSG` prints their logs and exits 1.
# start_standin NAME [ARGS]: sets STANDIN_ADDR. start_mongoguard NAME PORT [ARGS].
# Needs $bin_dir (build_binaries).
stack_init() {
    work="$(mktemp -d "${TMPDIR:-/tmp}/mongoguard-$1.XXXXXX")"
    pids=()
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$work"
}
show_logs() {
    local name
    for name in $(cd "$work" && ls -- *.log 2>/dev/null | sed 's/\.log$//'); do
        if [ -f "$work/$name.log" ]; then
            log "---- $name log (tail) ----"
            tail -n 60 "$work/$name.log" >&2 || true
        fi
    done
}

fail() {
    log "FAIL: $*"
    show_logs
    exit 1
}

# start_standin NAME [ARGS...]: starts a stand-in logging to $work/NAME.log; sets $STANDIN_ADDR.
start_standin() {
    local name="$1" port i pid
    shift
    port="$(free_port)"
    "$bin_dir/mongoguard-standin" --listen "127.0.0.1:$port" "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for ((i = 0; i < 120; i++)); do
        if grep -q "listening on" "$work/$name.log" 2>/dev/null; then
            STANDIN_ADDR="127.0.0.1:$port"
            log "$name on $STANDIN_ADDR (pid $pid)"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    fail "$name did not come up"
}

# start_mongoguard NAME PORT ARGS...: starts mongoguard logging to $work/NAME.log.
# (no admin listener unless $admin_listen names one)
start_mongoguard() {
    local name="$1" port="$2" pid
    shift 2
    "$bin_dir/mongoguard" --admin-listen "${admin_listen:-off}" "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    if ! wait_tcp 127.0.0.1 "$port" 120 || ! kill -0 "$pid" 2>/dev/null; then
        fail "$name did not come up"
    fi
    log "$name on 127.0.0.1:$port (pid $pid)"
}


# start_pooled USER [NAME [STANDIN ARGS...]]: a stand-in that requires authentication (user
# app / apppw; started with STANDIN ARGS) and a pooled mongoguard in front of it whose users
# file has USER with a random password; NAME (default "pooled") names their logs. Sets
# pooled_port, client_user, client_password, pooled_standin_addr, pooled_standin_uri (pool_size
# from $pool_size, default 4; more TOML sections from $pooled_extra_toml).
start_pooled() {
    local upstream_user=app upstream_password=apppw name="${2:-pooled}"
    client_user="$1"
    shift $(($# < 2 ? $# : 2))
    start_standin "standin-$name" --user "$upstream_user:$upstream_password" "$@"
    pooled_standin_addr="$STANDIN_ADDR"
    pooled_standin_uri="mongodb://$upstream_user:$upstream_password@$pooled_standin_addr/?authSource=admin"
    client_password="pw-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
    printf '%s' "$client_password" |
        "$bin_dir/mongoguard" users add --file "$work/users-$name.toml" "$client_user" >/dev/null ||
        fail "mongoguard users add failed"
    pooled_port="$(free_port)"
    cat >"$work/mongoguard-$name.toml" <<TOML
[proxy]
listen = "127.0.0.1:$pooled_port"
mode = "pooled"

[upstream]
uri = "$pooled_standin_uri"

[pool]
pool_size = ${pool_size:-4}
min_idle = 0
checkout_timeout = "5s"

[auth]
users_file = "$work/users-$name.toml"

[audit]
sink = "none"
${pooled_extra_toml:-}
TOML
    start_mongoguard "mongoguard-$name" "$pooled_port" --config "$work/mongoguard-$name.toml"
}

# npm_ci DIR: `npm ci` in DIR unless its node_modules already match its package-lock.json.
npm_ci() {
    local dir="$1" lock_sum stamp
    lock_sum="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
    stamp="$dir/node_modules/.mongoguard-lock.sha256"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
        log "npm ci in $dir"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
        echo "$lock_sum" >"$stamp"
    fi
}
