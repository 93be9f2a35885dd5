"""Runs register in a pyiceberg SQL catalog (SQLite by default, PostgreSQL for real)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from audit_helpers import write_table
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit import connect, registry
from lakeckpt_tables.checkpoint import CheckpointManager, registration
from lakeckpt_tables.cli import main


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _train(table: Path, root: Path, run_id: str, steps: int) -> list[str]:
    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(table)), batch_size=10, seed=1),
                                batch_size=None)
    manager = CheckpointManager(root, run_id, config={"experiment": "exp-1", "lr": 0.1})
    model = torch.nn.Linear(1, 1)
    ids = []
    for step, _ in enumerate(loader, start=1):
        if step > steps:
            break
        record = manager.save(step, model=model, dataloader=loader,
                              tags=("best",) if step == 2 else ())
        assert record is not None
        ids.append(record.checkpoint_id)
    return ids


def test_a_run_registers_with_latest_best_table_and_status(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LAKECKPT_REGISTRY", raising=False)
    first = _train(table, tmp_path / "root1", "run-one", 3)
    second = _train(table, tmp_path / "root2", "run-two", 2)
    assert registration.flush()
    runs = registry.registered_runs()
    assert [(r["run_id"], r["root"], r["status"], r["latest"], r["latest_step"], r["best"],
             r["best_step"], r["experiment"], r["table_uri"], r["table_version"])
            for r in runs] == [
        ("run-one", str(tmp_path / "root1"), "running", first[-1], "3", first[1], "2", "exp-1",
         str(table), "3"),
        ("run-two", str(tmp_path / "root2"), "running", second[-1], "2", second[1], "2", "exp-1",
         str(table), "3")]
    assert runs[0]["ledger"] == f"delta:{tmp_path / 'root1'}/_ledger"
    # every registered run at once
    con = connect(catalog="lakeckpt")
    assert con.sql("SELECT run_id, count(*), max(step) FROM checkpoints GROUP BY run_id "
                   "ORDER BY run_id").fetchall() == [("run-one", 3, 3), ("run-two", 2, 2)]
    assert main(["runs", "--output", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in shown] == ["run-one", "run-two"]


# Two runs, each a real process of its own that ends its way: one fresh interpreter imports
# torch and the library once (most of what a run costs here) and forks; the child's run raises
# (uncaught: the child ends on it), then the parent's run returns and the parent ends normally.
SCRIPT = """
import os, sys, torch
from lakeckpt_tables.checkpoint import CheckpointManager
def run(run_id, how):
    manager = CheckpointManager(sys.argv[1], run_id)
    manager.save(1, model=torch.nn.Linear(1, 1))
    if how == "raise":
        raise RuntimeError("diverged")
child = os.fork()
if child == 0:
    run("bad", "raise")
print("bad exited", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
run("ok", "return")
"""


def test_a_run_ending_normally_is_finished_and_one_raising_is_failed(tmp_path: Path) -> None:
    env = {**os.environ, "LAKECKPT_HOME": str(tmp_path / "home"), "PYTHONWARNINGS": "ignore"}
    env.pop("LAKECKPT_REGISTRY", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "root")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "bad exited 1\n"), done.stderr[-2000:]
    assert "RuntimeError: diverged" in done.stderr
    catalog = registry.load_catalog(f"sqlite:///{tmp_path}/home/catalog.db")
    assert [(r["run_id"], r["status"], r["latest_step"])
            for r in registry.registered_runs(catalog)] == [("bad", "failed", "1"),
                                                             ("ok", "finished", "1")]


def test_registration_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")
    CheckpointManager(tmp_path / "root", "quiet").save(1, model=torch.nn.Linear(1, 1))
    assert registration.flush()
    assert not (tmp_path / "home" / "catalog.db").exists()


def test_a_registry_that_cannot_be_written_logs_one_line_and_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "catalog.db"
    writable = registry.load_catalog(f"sqlite:///{db}")
    writable.create_namespace_if_not_exists((registry.NAMESPACE,))
    # a real read-only SQLite database: every write fails ("attempt to write a readonly
    # database"), as on a read-only mount (tests run as root, so file modes would not do)
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKECKPT__URI", f"sqlite:///file:{db}?mode=ro&uri=true")
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LAKECKPT_REGISTRY", raising=False)
    logger = "lakeckpt_tables.checkpoint.registration"
    with caplog.at_level(logging.DEBUG, logger=logger):
        manager = CheckpointManager(tmp_path / "root", "ro")
        for step in (1, 2, 3):
            manager.save(step, model=torch.nn.Linear(1, 1))
        assert registration.flush()
    records = [r for r in caplog.records if r.name == logger]
    warned = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and len(records) == 4  # registered, then three commits
    assert "run ro: the run registry cannot be written, training goes on" in warned[0].message
    assert "readonly database" in warned[0].message
    assert all(r.exc_info is None and "\n" not in r.message for r in records)
    assert [r.step for r in manager.checkpoints()] == [1, 2, 3]
    assert registry.registered_runs(writable) == []


@pytest.mark.postgres
def test_runs_register_in_a_postgresql_catalog(table: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    uri = os.environ.get("LAKECKPT_TEST_PG_URI")
    if not uri:
        pytest.skip("LAKECKPT_TEST_PG_URI is not set")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKECKPT__URI", uri)
    monkeypatch.delenv("LAKECKPT_REGISTRY", raising=False)
    run_id = f"pg-{uuid.uuid4().hex[:8]}"
    ids = _train(table, tmp_path / "root", run_id, 2)
    assert registration.flush()
    catalog = registry.load_catalog(uri)
    mine = [r for r in registry.registered_runs(catalog) if r["run_id"] == run_id]
    try:
        assert [(r["status"], r["latest"], r["best"]) for r in mine] == [
            ("running", ids[-1], ids[1])]
        assert main(["runs", "--catalog", uri, "--output", "json"]) == 0
        assert run_id in {r["run_id"] for r in json.loads(capsys.readouterr().out)}
    finally:
        for namespace in catalog.list_namespaces(registry.NAMESPACE):
            if namespace[-1].startswith(run_id):
                catalog.drop_namespace(namespace)
