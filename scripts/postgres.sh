#!/usr/bin/env bash
# Install (if missing) and start a local PostgreSQL for the catalog and ledger tests.
#
# Idempotent: safe to run again on a machine where PostgreSQL already runs. Meant for Debian,
# as root, without systemd (containers, CI). Progress goes to stderr; the last line on stdout
# is the SQLAlchemy URI to export as LAKECKPT_TEST_PG_URI:
#
#   export LAKECKPT_TEST_PG_URI="$(scripts/postgres.sh | tail -n 1)"
set -euo pipefail

PG_USER=lakeckpt
PG_PASSWORD=lakeckpt
PG_DB=lakeckpt
PG_HOST=127.0.0.1
PG_PORT=5432

log() { echo "postgres.sh: $*" >&2; }

install_postgres() {
    if command -v pg_ctlcluster >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
        return
    fi
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    # The package index is refreshed only when needed: an update costs more than the install.
    if ! apt-get install -y -q postgresql >&2; then
        apt-get update -q >&2
        apt-get install -y -q postgresql >&2
    fi
}

# Newest installed major version and its cluster name ("main" unless someone made another).
pg_version() { ls /usr/lib/postgresql | sort -V | tail -n 1; }

ensure_cluster() {
    local version="$1"
    if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main"' | grep -q .; then
        log "creating cluster $version/main"
        pg_createcluster "$version" main --port "$PG_PORT" >&2
    fi
}

start_cluster() {
    local version="$1"
    local status
    status="$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}')"
    if [[ "$status" != online* ]]; then
        log "starting cluster $version/main on $PG_HOST:$PG_PORT"
        # pg_ctlcluster needs no systemd when run as root; listen on loopback only.
        pg_ctlcluster "$version" main start -- -o "-c listen_addresses=$PG_HOST -c port=$PG_PORT" >&2
    fi
}

wait_ready() {
    for _ in $(seq 1 60); do
        if pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then
            return
        fi
        sleep 0.5
    done
    log "PostgreSQL did not accept connections on $PG_HOST:$PG_PORT within 30 s"
    exit 1
}

# Runs one SQL statement as the postgres superuser over the local socket (peer auth).
psql_admin() { runuser -u postgres -- psql -p "$PG_PORT" -v ON_ERROR_STOP=1 -tAq -c "$1"; }

ensure_role_and_db() {
    if [[ "$(psql_admin "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" != 1 ]]; then
        log "creating role $PG_USER"
        psql_admin "CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'"
    fi
    if [[ "$(psql_admin "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]]; then
        log "creating database $PG_DB"
        psql_admin "CREATE DATABASE $PG_DB OWNER $PG_USER"
    fi
}

main() {
    install_postgres
    local version
    version="$(pg_version)"
    ensure_cluster "$version"
    start_cluster "$version"
    wait_ready
    ensure_role_and_db
    PGPASSWORD="$PG_PASSWORD" psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" \
        -tAqc "SELECT 1" >/dev/null
    echo "postgresql+psycopg://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB"
}

main "$@"
