"""The examples run end to end at small sizes and prove what they claim (exit 0, ``PROOF OK``).

Each example is a real subprocess, as a user runs it: ``python examples/<name>.py ...``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 180

pytestmark = pytest.mark.slow  # every test runs an example in a process of its own

SMALL_TRAIN = ["--rows", "3000", "--group-rows", "250", "--batch-size", "100",
               "--checkpoint-every", "6", "--epochs", "2"]
# the Iceberg runs (the catalog's part does not grow with the table): 1,000 rows, 2 epochs of 10
# steps, preempted at step 12 (the second epoch), checkpoints every 4
SMALL_ICEBERG = ["--rows", "1000", "--group-rows", "100", "--batch-size", "100",
                 "--checkpoint-every", "4", "--epochs", "2"]
SMALL_FOLLOW = ["--initial-rows", "200", "--commits", "8", "--commit-rows", "40",
                "--interval", "0.15", "--min-segment-rows", "80"]


def run_example(name: str, *args: str) -> list[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env, cwd=EXAMPLES.parent)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-4000:]}\n" \
                                 f"{done.stderr[-4000:]}"
    assert lines and lines[-1].startswith("PROOF OK"), done.stdout[-4000:]
    return lines


@pytest.fixture(scope="module")
def train_delta(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """What ``train_delta.py`` printed and the checkpoint root it kept: one run serves the
    example's own test and the test of ``progress_sql.py`` on an existing root."""
    base = tmp_path_factory.mktemp("train-delta")
    lines = run_example("train_delta.py", *SMALL_TRAIN, "--work", str(base / "train"),
                        "--root", str(base / "ck"))
    return lines, base / "ck"


def test_train_delta_resumes_a_preempted_run_exactly(
        train_delta: tuple[list[str], Path]) -> None:
    lines, _ = train_delta
    assert any(x.startswith("job 2: restored step") for x in lines)
    assert any(x.startswith("ids: 3,000 rows x 2 epochs, 6,000 trained, 0 duplicated, 0 "
                            "missing: OK") for x in lines)


def test_train_iceberg_resumes_a_preempted_run_exactly() -> None:
    lines = run_example("train_iceberg.py", *SMALL_ICEBERG)
    assert any(x.startswith("ledger iceberg:") and x.endswith("OK") for x in lines)


@pytest.mark.postgres
def test_train_iceberg_on_a_postgresql_catalog() -> None:
    uri = os.environ.get("LAKECKPT_TEST_PG_URI")
    if not uri:
        pytest.skip("LAKECKPT_TEST_PG_URI is not set")
    run_example("train_iceberg.py", "--catalog-uri", uri, *SMALL_ICEBERG)


@pytest.mark.parametrize("backend", ["delta", "iceberg"])
def test_progress_sql_queries_an_empty_then_a_resumed_ledger(backend: str) -> None:
    lines = run_example("progress_sql.py", "--backend", backend, "--rows", "1200")
    text = "\n".join(lines)
    for title in ("-- runs", "-- progress per run and pass", "-- rows per checkpoint",
                  "-- restores", "-- which checkpoints read"):
        assert title in text
    assert "progress columns: ['run_id', 'segment', 'epoch', 'state', 'rows_consumed'," \
           in text
    assert "progress: [(0, 1200, 1200), (1, 1200, 1200)]; ids trained twice each" in text
    assert "verify run example up to step" in text and text.count(": OK") == 1


def test_progress_sql_reads_an_existing_root(train_delta: tuple[list[str], Path]) -> None:
    _, root = train_delta
    lines = run_example("progress_sql.py", "--root", str(root))
    assert any(line.startswith(f"ledger delta:{root}/_ledger at version ") for line in lines)


def test_audit_deletion_names_the_checkpoints_that_saw_user_42() -> None:
    lines = run_example("audit_deletion.py")
    assert "runs to retrain: ['after']" in lines
