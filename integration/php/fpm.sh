# shellcheck shell=bash
# PHP-FPM load scenario (sourced by integration/run_pooled.sh; needs common.sh's `log`).
#
#   php_setup                      finds php-fpm (installs php-fpm php-cli php-mongodb
#                                  libfcgi-bin with apt-get when missing and root); sets $PHP_FPM
#   fpm_start WORKDIR [WORKERS]    starts a static pool (default 50 workers) on WORKDIR/php-fpm.sock
#   fpm_stop                       stops it
#   fpm_load URI RUN N CONCURRENCY OUT
#                                  N requests of request.php (new Manager, insert, find) with
#                                  CONCURRENCY in flight, through cgi-fcgi under xargs -P.
#                                  Every document gets run=RUN and _id=RUN-<i>. One JSON line
#                                  per request goes to OUT; prints a summary; sets
#                                  FPM_LOAD_OK, FPM_LOAD_FAILED, FPM_LOAD_PIDS, FPM_LOAD_SECONDS;
#                                  returns non-zero unless all N succeeded.

PHP_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PHP_FPM=""
FPM_PID=""
FPM_WORK=""

_php_ready() {
    local fpm
    command -v cgi-fcgi >/dev/null 2>&1 || return 1
    fpm="$(command -v php-fpm 2>/dev/null || true)"
    if [ -z "$fpm" ]; then
        # Debian names it php-fpmX.Y (in /usr/sbin, not always on a user's PATH).
        fpm="$(find /usr/sbin /usr/bin /usr/local/sbin -maxdepth 1 -name 'php-fpm*' \
            -type f 2>/dev/null | sort -V | tail -n 1)"
    fi
    [ -n "$fpm" ] && [ -x "$fpm" ] || return 1
    # (not `| grep -q`: with pipefail, grep exiting early can fail the pipeline via SIGPIPE)
    case "$("$fpm" -m 2>/dev/null)" in
        *$'\n'mongodb$'\n'* | *$'\n'mongodb) ;;
        *) return 1 ;;
    esac
    PHP_FPM="$fpm"
}

php_setup() {
    if _php_ready; then
        log "php-fpm: $PHP_FPM ($("$PHP_FPM" -v | head -n 1)); ext-mongodb $(php -r 'echo phpversion("mongodb");' 2>/dev/null || echo '?')"
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing php-fpm php-cli php-mongodb libfcgi-bin with apt-get"
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            php-fpm php-cli php-mongodb libfcgi-bin >/dev/null
    fi
    if ! _php_ready; then
        log "php-fpm with ext-mongodb and cgi-fcgi (libfcgi-bin) are required" \
            "(apt-get install php-fpm php-cli php-mongodb libfcgi-bin)"
        return 1
    fi
    log "php-fpm: $PHP_FPM ($("$PHP_FPM" -v | head -n 1)); ext-mongodb $(php -r 'echo phpversion("mongodb");' 2>/dev/null || echo '?')"
}

fpm_start() {
    local work="$1" workers="${2:-50}" user_lines="" args=(-F -y "$1/php-fpm.conf") i
    FPM_WORK="$work"
    if [ "$(id -u)" = 0 ]; then
        # FPM refuses to run workers as root unless told to (-R) and given the user.
        user_lines=$'user = root\ngroup = root'
        args+=(-R)
    fi
    WORK="$work" WORKERS="$workers" USER_LINES="$user_lines" python3 - "$PHP_DIR/php-fpm.conf.in" \
        "$work/php-fpm.conf" <<'PYEOF'
import os, sys
text = open(sys.argv[1]).read()
for key in ("WORK", "WORKERS", "USER_LINES"):
    text = text.replace(f"@{key}@", os.environ[key])
open(sys.argv[2], "w").write(text)
PYEOF
    "$PHP_FPM" "${args[@]}" >"$work/php-fpm.out" 2>&1 &
    FPM_PID=$!
    for ((i = 0; i < 120; i++)); do
        if [ -S "$work/php-fpm.sock" ] && grep -q "ready to handle connections" "$work/php-fpm.log" 2>/dev/null; then
            log "php-fpm on $work/php-fpm.sock (pid $FPM_PID, $workers static workers)"
            return 0
        fi
        kill -0 "$FPM_PID" 2>/dev/null || break
        sleep 0.25
    done
    log "php-fpm did not come up"
    fpm_logs
    return 1
}

fpm_logs() {
    [ -n "$FPM_WORK" ] || return 0
    local f
    for f in php-fpm.out php-fpm.log php-errors.log; do
        if [ -s "$FPM_WORK/$f" ]; then
            log "---- $f (tail) ----"
            tail -n 30 "$FPM_WORK/$f" >&2 || true
        fi
    done
}

fpm_stop() {
    if [ -n "$FPM_PID" ] && kill -0 "$FPM_PID" 2>/dev/null; then
        kill -QUIT "$FPM_PID" 2>/dev/null || true # graceful: workers finish, then exit
        local i
        for ((i = 0; i < 40; i++)); do
            kill -0 "$FPM_PID" 2>/dev/null || break
            sleep 0.25
        done
        kill "$FPM_PID" 2>/dev/null || true
        wait "$FPM_PID" 2>/dev/null || true
    fi
    FPM_PID=""
}

# One FastCGI request per argument (a request number); prints request.php's JSON line, or a
# JSON error line when there is none. Runs in the bash processes xargs starts.
_fcgi_requests() {
    local i out line
    for i in "$@"; do
        out="$(REQUEST_ID="$FCGI_RUN-$i" MONGO_RUN="$FCGI_RUN" MONGO_URI="$FCGI_URI" \
            SCRIPT_FILENAME="$FCGI_SCRIPT" SCRIPT_NAME=/request.php REQUEST_URI=/request.php \
            REQUEST_METHOD=GET QUERY_STRING="" SERVER_PROTOCOL=HTTP/1.1 GATEWAY_INTERFACE=CGI/1.1 \
            cgi-fcgi -bind -connect "$FCGI_SOCK" 2>&1)"
        line="$(printf '%s\n' "$out" | grep -m 1 '^{' || true)"
        if [ -z "$line" ]; then
            line="$(printf '%s' "$out" | tr -d '\r' | tr '\n' ' ' | head -c 300 |
                python3 -c 'import json, sys; print(json.dumps({"ok": False, "id": sys.argv[1], "error": "no JSON from FPM: " + sys.stdin.read()}))' "$FCGI_RUN-$i")"
        fi
        # One write per line (< PIPE_BUF), so lines of concurrent requests never interleave.
        printf '%s\n' "$line"
    done
}

fpm_load() {
    local uri="$1" run="$2" n="$3" conc="$4" out="$5" per_proc t0 t1 summary
    # Each bash started by xargs runs a few requests in sequence (fewer forks); CONCURRENCY
    # bash processes run at once, so CONCURRENCY requests are in flight.
    per_proc=$(((n + conc * 4 - 1) / (conc * 4)))
    [ "$per_proc" -ge 1 ] || per_proc=1
    export -f _fcgi_requests
    t0="$(date +%s.%N)"
    seq 1 "$n" | FCGI_URI="$uri" FCGI_RUN="$run" FCGI_SOCK="$FPM_WORK/php-fpm.sock" \
        FCGI_SCRIPT="$PHP_DIR/request.php" \
        xargs -P "$conc" -n "$per_proc" bash -c '_fcgi_requests "$@"' _ >"$out"
    t1="$(date +%s.%N)"
    summary="$(python3 - "$out" "$n" "$t0" "$t1" <<'PYEOF'
import json, sys
path, n, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
ok, failed, pids, ids, errors = 0, 0, set(), set(), {}
for raw in open(path):
    try:
        r = json.loads(raw)
    except ValueError:
        r = {"ok": False, "error": "bad line: " + raw[:200]}
    if r.get("pid"):
        pids.add(r["pid"])
    if r.get("ok"):
        ok += 1
        ids.add(r["id"])
    else:
        failed += 1
        key = r.get("error", "?")[:200]
        errors[key] = errors.get(key, 0) + 1
missing = n - ok - failed
print(f"FPM_LOAD_OK={ok} FPM_LOAD_FAILED={failed + missing} FPM_LOAD_PIDS={len(pids)} "
      f"FPM_LOAD_UNIQUE_IDS={len(ids)} FPM_LOAD_SECONDS={t1 - t0:.1f}")
for e, c in sorted(errors.items(), key=lambda x: -x[1])[:5]:
    print(f"  {c} x {e}", file=sys.stderr)
if missing:
    print(f"  {missing} requests produced no line", file=sys.stderr)
PYEOF
)"
    eval "$summary"
    log "php-fpm run $run: $FPM_LOAD_OK/$n ok, $FPM_LOAD_FAILED failed, $FPM_LOAD_PIDS distinct" \
        "workers, ${FPM_LOAD_SECONDS}s (concurrency $conc)"
    [ "$FPM_LOAD_OK" = "$n" ] && [ "$FPM_LOAD_UNIQUE_IDS" = "$n" ]
}
