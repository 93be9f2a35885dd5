#!/usr/bin/env bash
# Set up a virtualenv in .venv (once) and run the demo or the test suite.
#
#   scripts/dev.sh demo [args...]   set up, then `lakeckpt demo`
#   scripts/dev.sh test [args...]   set up (with PostgreSQL), then the test suite
#
# A machine without torch gets exactly torch==2.13.0 (the CPU build pip finds locally);
# asking pip for any newer torch would download gigabytes of CUDA wheels. With a torch of your
# own already in the venv, nothing is reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LAKECKPT_VENV:-.venv}
PY=${PYTHON:-python3}

setup() {
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        "$VENV/bin/pip" install --quiet "torch==2.13.0"
    fi
    "$VENV/bin/pip" install --quiet -e ".[dev]"
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
        if [ -z "${LAKECKPT_TEST_PG_URI:-}" ]; then
            LAKECKPT_TEST_PG_URI=$(scripts/postgres.sh | tail -n 1)
            export LAKECKPT_TEST_PG_URI
        fi
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    *)
        echo "usage: scripts/dev.sh {demo|test} [args...]" >&2
        exit 64
        ;;
esac
