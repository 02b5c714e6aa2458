# shellcheck shell=bash
# Shared by bench/run.sh and bench/run_pooled.sh (sourced, not run). The sourcing script sets
# BENCH_NAME first. Provides WORK (a temporary directory, kept with log tails on failure),
# PIDS (processes stopped on exit), log, die, port_in_use, pick_port, wait_for_port,
# wait_for_line.

WORK="$(mktemp -d -t "mongoguard-$BENCH_NAME.XXXXXX")"
PIDS=()
PICKED=()

log() { printf '[%s] %s\n' "$BENCH_NAME" "$*" >&2; }

cleanup() {
    local rc=$?
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        log "failed (exit $rc); logs kept in $WORK"
        local f
        for f in "$WORK"/*.log; do
            [[ -f "$f" ]] || continue
            log "--- tail of $f"
            tail -n 20 "$f" >&2 || true
        done
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() {
    log "error: $*"
    exit 1
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# pick_port ENV_VALUE DEFAULT: an explicit port must be free; a default may slide up past busy
# ports and past those in PICKED. It runs in $(...), so the caller adds the result to PICKED.
pick_port() {
    local explicit="$1" p="$2" tries=0
    if [[ -n "$explicit" ]]; then
        port_in_use "$explicit" && die "port $explicit is already in use"
        echo "$explicit"
        return
    fi
    while port_in_use "$p" || [[ " ${PICKED[*]} " == *" $p "* ]]; do
        p=$((p + 1))
        tries=$((tries + 1))
        [[ $tries -lt 200 ]] || die "no free port near $2"
    done
    echo "$p"
}

# wait_for_port PORT PID NAME: until the port accepts connections (30 s max); 1 (logged) if
# NAME died or never listened.
wait_for_port() {
    local port="$1" pid="$2" name="$3" i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || {
            log "$name exited before listening (see $WORK/$name.log)"
            return 1
        }
        port_in_use "$port" && return 0
        sleep 0.1
    done
    log "$name did not listen on 127.0.0.1:$port within 30 s"
    return 1
}

# wait_for_line FILE TEXT PID NAME: until FILE contains the exact line TEXT (30 s max).
wait_for_line() {
    local file="$1" text="$2" pid="$3" name="$4" i
    for ((i = 0; i < 300; i++)); do
        grep -qxF "$text" "$file" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || die "$name exited before printing '$text'"
        sleep 0.1
    done
    die "$name did not print '$text' within 30 s"
}

# rederive_scram_users FILE ITERATIONS: rewrites FILE's SCRAM-SHA-256 secrets for the password
# in $APP_PASSWORD at another iteration count (RFC 5802: SaltedPassword = PBKDF2(password,
# salt, i), StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey =
# HMAC(SaltedPassword, "Server Key"); an ASCII password is its own SASLprep).
rederive_scram_users() {
    APP_PASSWORD="$APP_PASSWORD" python3 - "$1" "$2" <<'PY'
import base64, hashlib, hmac, os, re, sys
path, iters = sys.argv[1], int(sys.argv[2])
pw = os.environ["APP_PASSWORD"].encode()
salt = os.urandom(28)
salted = hashlib.pbkdf2_hmac("sha256", pw, salt, iters)
stored = hashlib.sha256(hmac.new(salted, b"Client Key", hashlib.sha256).digest()).digest()
server = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
b64 = lambda b: base64.b64encode(b).decode()
block = (f'[users.mechanisms.SCRAM-SHA-256]\nsalt = "{b64(salt)}"\niterations = {iters}\n'
         f'stored_key = "{b64(stored)}"\nserver_key = "{b64(server)}"\n')
text = open(path).read()
new, n = re.subn(r'\[users\.mechanisms\.SCRAM-SHA-256\]\n(?:[a-z_]+ = .*\n)+', block, text)
if n != 1:
    sys.exit("no single SCRAM-SHA-256 block in the users file")
open(path, "w").write(new)
PY
}

# release_binaries NAME...: builds the release binaries (unless SKIP_BUILD=1), sets BIN to
# their directory (BIN_DIR, else CARGO_TARGET_DIR's or the repository's target/release) and
# dies naming the first of NAME that is missing there.
release_binaries() {
    if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
        local packages=(-p mongoguard-standin -p mongoguard) b
        for b in "$@"; do
            # loadgen, delayrelay and tokiorelay are the bench crate's.
            if [[ $b == loadgen || $b == delayrelay || $b == tokiorelay ]]; then
                packages+=(-p mongoguard-bench)
                break
            fi
        done
        log "building release binaries"
        cargo build --release "${packages[@]}"
    fi
    BIN="${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}"
    for b in "$@"; do
        [[ -x "$BIN/$b" ]] || die "missing binary $BIN/$b"
    done
}
