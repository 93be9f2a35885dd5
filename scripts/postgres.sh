#!/usr/bin/env bash
# Install (if missing) and start a local PostgreSQL for the catalog and ledger tests.
#
# Idempotent: safe to run again on a machine where PostgreSQL already runs. Meant for Debian,
# as root (or with passwordless sudo), without systemd (containers, CI): the server is
# installed with apt-get and its cluster started with pg_ctlcluster, listening on 127.0.0.1.
# Progress and errors go to stderr; the last line on stdout is the SQLAlchemy URI to export as
# LAKECKPT_TEST_PG_URI:
#
#   export LAKECKPT_TEST_PG_URI="$(scripts/postgres.sh | tail -n 1)"
#
# Any failure exits non-zero with a message saying what failed.
#
# Environment (defaults): LAKECKPT_PG_CLUSTER (main) and LAKECKPT_PG_PORT (5432) choose the
# Debian cluster to use or create; an existing cluster keeps the port it was created with.
set -euo pipefail

PG_USER=lakeckpt
PG_PASSWORD=lakeckpt
PG_DB=lakeckpt
PG_HOST=127.0.0.1
PG_CLUSTER=${LAKECKPT_PG_CLUSTER:-main}
PG_PORT=${LAKECKPT_PG_PORT:-5432}
# C.UTF-8 exists on every Debian: initdb (run by apt's postinst or pg_createcluster) fails on a
# locale from the environment that the machine has not generated.
export LANG=C.UTF-8 LC_ALL=C.UTF-8

log() { echo "postgres.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
trap 'log "error: failed (line $LINENO, exit $?): $BASH_COMMAND"' ERR

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n --preserve-env=LAKECKPT_PG_CLUSTER,LAKECKPT_PG_PORT "$0" "$@"
    fi
    die "needs root (apt-get, pg_ctlcluster) and passwordless sudo is not available;" \
        "run as root, or set LAKECKPT_TEST_PG_URI to an existing server"
fi

have_server() {
    command -v pg_ctlcluster >/dev/null 2>&1 && command -v pg_lsclusters >/dev/null 2>&1 \
        && compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

install_postgres() {
    have_server && return
    command -v apt-get >/dev/null 2>&1 \
        || die "PostgreSQL is not installed and there is no apt-get to install it with"
    log "installing postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get -y -q --no-install-recommends -o DPkg::Lock::Timeout=300
               -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    # The package index is refreshed only when needed: an update costs more than the install.
    if ! "${apt[@]}" install postgresql >&2; then
        log "apt-get install failed; running apt-get update and trying again"
        "${apt[@]}" update >&2 || die "apt-get update failed"
        "${apt[@]}" install postgresql >&2 || die "apt-get install postgresql failed"
    fi
    have_server || die "apt-get installed postgresql but no server is under /usr/lib/postgresql"
}

# One field of our cluster's line in pg_lsclusters (1 version, 3 port, 4 status), for $1.
cluster_field() {
    pg_lsclusters -h | awk -v v="$1" -v c="$PG_CLUSTER" -v f="$2" '$1 == v && $2 == c {print $f}'
}

# The version to use: the newest one that has our cluster, else the newest installed.
pg_version() {
    local v
    v=$(pg_lsclusters -h | awk -v c="$PG_CLUSTER" '$2 == c {print $1}' | sort -V | tail -n 1)
    [ -n "$v" ] || v=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    [ -n "$v" ] || die "no PostgreSQL version found under /usr/lib/postgresql"
    echo "$v"
}

ensure_cluster() {
    local version="$1"
    if [ -z "$(cluster_field "$version" 2)" ]; then
        log "creating cluster $version/$PG_CLUSTER on port $PG_PORT"
        pg_createcluster "$version" "$PG_CLUSTER" --port "$PG_PORT" >&2 \
            || die "pg_createcluster $version $PG_CLUSTER failed"
    fi
    local port
    port=$(cluster_field "$version" 3)
    if [ "$port" != "$PG_PORT" ]; then
        log "cluster $version/$PG_CLUSTER is configured for port $port; using that"
        PG_PORT=$port
    fi
}

start_cluster() {
    local version="$1" status
    status=$(cluster_field "$version" 4)
    if [[ "$status" != online* ]]; then
        log "starting cluster $version/$PG_CLUSTER on $PG_HOST:$PG_PORT"
        # As root pg_ctlcluster needs no systemd (it runs pg_ctl and waits); loopback only.
        if ! pg_ctlcluster "$version" "$PG_CLUSTER" start -- \
                -o "-c listen_addresses=$PG_HOST" >&2; then
            local logfile=/var/log/postgresql/postgresql-$version-$PG_CLUSTER.log
            [ -r "$logfile" ] && tail -n 20 "$logfile" >&2
            die "pg_ctlcluster $version $PG_CLUSTER start failed (log: $logfile)"
        fi
    fi
}

wait_ready() {
    for _ in $(seq 1 60); do
        if pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then
            return
        fi
        sleep 0.5
    done
    die "PostgreSQL did not accept connections on $PG_HOST:$PG_PORT within 30 s"
}

# Runs one SQL statement as the postgres superuser over the local socket (peer auth); from /
# so that psql can't complain about a working directory the postgres user cannot read.
psql_admin() {
    (cd / && runuser -u postgres -- psql -p "$PG_PORT" -v ON_ERROR_STOP=1 -tAq -c "$1")
}

ensure_role_and_db() {
    if [[ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" != 1 ]]; then
        log "creating role $PG_USER"
        psql_admin "CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'"
    else
        # Idempotent, and repairs a role left with another password or without LOGIN.
        psql_admin "ALTER ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'"
    fi
    if [[ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]]; then
        log "creating database $PG_DB"
        psql_admin "CREATE DATABASE $PG_DB OWNER $PG_USER"
    fi
}

main() {
    install_postgres
    local version
    version=$(pg_version)
    ensure_cluster "$version"
    start_cluster "$version"
    wait_ready
    ensure_role_and_db
    PGPASSWORD="$PG_PASSWORD" psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" \
        -tAqc "SELECT 1" >/dev/null \
        || die "cannot log in as $PG_USER over TCP at $PG_HOST:$PG_PORT (pg_hba.conf?)"
    log "ready: PostgreSQL $version/$PG_CLUSTER on $PG_HOST:$PG_PORT"
    echo "postgresql+psycopg://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB"
}

main "$@"
