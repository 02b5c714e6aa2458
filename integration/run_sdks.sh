#!/usr/bin/env bash
# The clients the standards name beyond pymongo, PHP, Node.js and Rust — the Go driver, the Java
# driver 3.6 (legacy-era: OP_QUERY handshake, SCRAM-SHA-1), mongosh (npm, pinned), and mgo (every
# command as OP_QUERY, against a 5.0-like upstream) — unmodified, through mongoguard in
# passthrough and pooled mode, against the stand-in. Each suite: CRUD, a cursor past its first
# batch, a blocked command seen as a clear error with no retry, compression where the mode
# negotiates it, pooled authentication. Installs its toolchains with apt-get when missing
# (root on Debian). Prints the client versions it ran.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

need_apt() {
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ "${#missing[@]}" = 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "missing Debian packages: ${missing[*]} (run as root on Debian, or install them)"
        exit 1
    fi
    log "apt-get install ${missing[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null
}
need_apt golang-go golang-mongodb-mongo-driver-dev golang-gopkg-mgo.v2-dev libmongodb-java libmongodb-perl \
    default-jdk-headless

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }
log "go $(go version | cut -d' ' -f3), golang-mongodb-mongo-driver-dev $(pkg_version golang-mongodb-mongo-driver-dev)"
log "mgo (gopkg.in/mgo.v2) $(pkg_version golang-gopkg-mgo.v2-dev)"
log "java $(java -version 2>&1 | head -1 | cut -d'"' -f2), libmongodb-java $(pkg_version libmongodb-java)"

npm_ci "$INTEGRATION_DIR/mongosh"
mongosh="$INTEGRATION_DIR/mongosh/node_modules/.bin/mongosh"
log "mongosh $("$mongosh" --version)"

build_binaries
stack_init sdks

# ---- the clients, built once -----------------------------------------------------------------
export GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="${GOCACHE:-$REPO_DIR/target/sdks/gocache}"
mkdir -p "$GOCACHE" "$work/java"
(cd "$INTEGRATION_DIR/go" && go build -o "$work/sdk-go" sdk.go) || fail "go build"
(cd "$INTEGRATION_DIR/legacy" && go build -o "$work/sdk-mgo" mgo.go) || fail "go build (mgo)"
java_cp="/usr/share/java/mongo-java-driver.jar"
javac -d "$work/java" -cp "$java_cp" "$INTEGRATION_DIR/java/Sdk.java" || fail "javac"

# ---- the stacks --------------------------------------------------------------------------------
start_standin standin
plain_addr="$STANDIN_ADDR"
proxy_port="$(free_port)"
start_mongoguard mongoguard "$proxy_port" --listen "127.0.0.1:$proxy_port" \
    --upstream "mongodb://$plain_addr"
pooled_admin="127.0.0.1:$(free_port)"
admin_listen="$pooled_admin" start_pooled sdkuser

# Pooled mode sends requests upstream decompressed (the stand-in's counter stays put): the
# compressed requests are counted on mongoguard's own metrics, around each client's suite.
compressed_requests() {
    # awk reads to the end: an early exit would fail curl's write (pipefail).
    curl -sf "http://$1/metrics" | awk '/^mongoguard_compressed_requests_total /{v = $2} END {print v}'
}
check_compressed() {
    local client="$1" admin="$2" before="$3" after
    [ -n "$admin" ] || return 0
    after="$(compressed_requests "$admin")"
    [ -n "$after" ] && [ "$((after - before))" -ge 5 ] ||
        fail "$client, pooled mode: ${after:-?} - $before compressed requests reached mongoguard"
    log "$client, pooled mode: $((after - before)) compressed requests reached mongoguard"
}

run_suite() {
    local mode="$1" uri="$2" standin="$3" compression="$4" admin="${5:-}" status=0 before=0
    [ -z "$admin" ] || before="$(compressed_requests "$admin")"
    MG_MODE="$mode" MG_URI="$uri" MG_STANDIN_URI="$standin" MG_COMPRESSION="$compression" \
        timeout 120 "$work/sdk-go" || status=$?
    [ "$status" = 0 ] || fail "Go driver, $mode mode (exit $status)"
    check_compressed "Go driver" "$admin" "$before"
    [ -z "$admin" ] || before="$(compressed_requests "$admin")"
    MG_MODE="$mode" MG_URI="$uri&compressors=zlib&retryWrites=true" MG_STANDIN_URI="$standin" \
        MG_COMPRESSION="$compression" \
        timeout 120 java -cp "$work/java:$java_cp" Sdk || status=$?
    [ "$status" = 0 ] || fail "Java driver, $mode mode (exit $status)"
    check_compressed "Java driver" "$admin" "$before"
    [ -z "$admin" ] || before="$(compressed_requests "$admin")"
    MG_MODE="$mode" MG_STANDIN_URI="$standin" MG_COMPRESSION="$compression" \
        timeout 120 "$mongosh" "$uri&compressors=zlib" --quiet --norc \
        --file "$INTEGRATION_DIR/mongosh/suite.js" || status=$?
    [ "$status" = 0 ] || fail "mongosh, $mode mode (exit $status)"
    check_compressed "mongosh" "$admin" "$before"
}

run_suite passthrough "mongodb://127.0.0.1:$proxy_port/?appName=sdk" \
    "mongodb://$plain_addr" 1
run_suite pooled \
    "mongodb://$client_user:$client_password@127.0.0.1:$pooled_port/?authSource=admin" \
    "mongodb://$pooled_standin_addr" 0 "$pooled_admin"
# ---- mgo, the legacy Go driver: OP_QUERY for every command, getnonce on every connection,
# SCRAM-SHA-1 over OP_QUERY. MongoDB 5.0 (wire 13) is the newest server it can talk to: 5.1+
# refuses OP_QUERY commands other than the handshake (the stand-in does too, from wire 17).
start_standin standin-legacy --wire-version 13
legacy_addr="$STANDIN_ADDR"
legacy_port="$(free_port)"
start_mongoguard mongoguard-legacy "$legacy_port" --listen "127.0.0.1:$legacy_port" \
    --upstream "mongodb://$legacy_addr"
start_pooled mgouser legacy-pooled --wire-version 13
run_mgo() {
    local mode="$1" status=0
    shift
    env MG_MODE="$mode" "$@" timeout 120 "$work/sdk-mgo" || status=$?
    [ "$status" = 0 ] || fail "mgo, $mode mode (exit $status)"
}
run_mgo passthrough MG_ADDR="127.0.0.1:$legacy_port"
run_mgo pooled MG_ADDR="127.0.0.1:$pooled_port" MG_USER="$client_user" MG_PASSWORD="$client_password"
# ---- the Perl driver: OP_QUERY for commands, OP_INSERT / OP_UPDATE / OP_DELETE for w=0 writes.
run_perl() {
    local mode="$1" uri="$2" status=0
    MG_MODE="$mode" MG_URI="$uri" timeout 120 perl "$INTEGRATION_DIR/legacy/perl.pl" || status=$?
    [ "$status" = 0 ] || fail "Perl driver, $mode mode (exit $status)"
}
run_perl passthrough "mongodb://127.0.0.1:$legacy_port/"
run_perl pooled "mongodb://$client_user:$client_password@127.0.0.1:$pooled_port/?authSource=admin"
log "Go, Java, mongosh, mgo and Perl: both modes passed"
