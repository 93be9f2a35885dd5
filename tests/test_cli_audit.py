"""The read and maintenance commands of ``lakeckpt``, run as a user runs them."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from audit_helpers import SimulatedRun, write_table
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.cli import main
from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger, LedgerEvent

LAKECKPT = [sys.executable, "-m", "lakeckpt_tables.cli"]
COMMANDS = ("demo", "bench", "progress", "checkpoints", "audit", "verify", "sql", "runs", "tag",
            "gc", "maintain", "report")


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


@pytest.fixture(scope="module")
def root(table: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[SimulatedRun]]:
    """Two runs over the table in one root: 'a' finished (2 epochs), 'b' half way."""
    path = tmp_path_factory.mktemp("ck")
    ledger = DeltaLedger(str(path / "_ledger"))
    a = SimulatedRun(table, ledger, "a", world=2, batch=7, window=3, epochs=2, seed=1)
    while a.train(8):
        a.checkpoint()
    if a.pending:
        a.checkpoint()
    b = SimulatedRun(table, ledger, "b", world=2, batch=5, window=2, seed=2)
    for _ in range(3):
        b.train(4)
        b.checkpoint()
    return path, [a, b]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    code, out, err = _run([*args, "--output", "json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_help_lists_every_command_on_one_line() -> None:
    done = subprocess.run([*LAKECKPT, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    for name in COMMANDS:
        assert any(line.split()[:1] == [name] for line in lines), name


def test_a_missing_root_is_an_error_and_creates_nothing(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("checkpoints", "progress", "verify"):
        code, _, err = _run([command, str(tmp_path / "missing")], capsys)
        assert code == 2 and "does not exist" in err and "nothing was created" in err
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_lists_each_run_and_hides_retired_ones_unless_all(
        table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "r")
    for _ in range(2):
        run.train(3)
        run.checkpoint()
    second = run.run.records[-1]
    ledger.record_events("r", [LedgerEvent("retired", {
        "checkpoint_id": second.checkpoint_id, "step": second.step, "reason": "bad checksum"})])
    shown = _json(["checkpoints", str(tmp_path)], capsys)
    assert [(r["step"], r["status"]) for r in shown] == [(3, "committed")]
    everything = _json(["checkpoints", str(tmp_path), "--all"], capsys)
    assert [(r["step"], r["status"], r["retired_reason"]) for r in everything] == [
        (3, "committed", None), (6, "retired", "bad checksum")]


def test_an_iceberg_ledger_is_seen_through_its_catalog(table: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/cat.db"
    catalog = SqlCatalog("lakeckpt", uri=uri, warehouse=f"file://{tmp_path}/wh")
    run = SimulatedRun(table, IcebergLedger("ml.ledger", catalog=catalog), "ice")
    run.train(2)
    run.checkpoint()
    shown = _json(["checkpoints", "iceberg:ml.ledger", "--catalog", uri], capsys)
    assert [(r["run_id"], r["step"], r["rows"]) for r in shown] == [("ice", 2, 28)]
    progress = _json(["progress", "iceberg:ml.ledger", "--catalog", uri], capsys)
    assert [(r["rows_consumed"], r["rows_in_pass"]) for r in progress] == [(28, 400)]


def test_progress_per_run_in_json_and_csv(root: tuple[Path, list[SimulatedRun]],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    rows = _json(["progress", str(path)], capsys)
    assert [(r["run_id"], r["epoch"], r["rows_consumed"], r["percent"]) for r in rows] == [
        ("a", 0, 400, 100.0), ("a", 1, 400, 100.0), ("b", 0, 120, 30.0)]
    code, out, _ = _run(["progress", str(path), "--run", "b", "--output", "csv"], capsys)
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [(r["run_id"], r["rows_consumed"]) for r in parsed] == [("b", "120")]
    code, out, _ = _run(["progress", str(path)], capsys)
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
             if line.startswith("│")]
    assert code == 0 and [c[:3] + c[5:8] for c in cells] == [
        ["a", "0", "0", "400", "400", "100"], ["a", "0", "1", "400", "400", "100"],
        ["b", "0", "0", "120", "400", "30"]]
    assert [c[3] for c in cells[:2]] == ["done", "done"] and cells[2][3] in ("running", "stale")


def test_piping_into_head_ends_quietly(root: tuple[Path, list[SimulatedRun]]) -> None:
    path, _ = root
    query = "SELECT * FROM range(200000) t(i)"
    cmd = " ".join([sys.executable, "-m", "lakeckpt_tables.cli", "sql", str(path),
                    f'"{query}"', "--output", "csv", "| head -2"])
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.stdout.splitlines() == ["i", "0"]
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_verify_exits_0_then_1_naming_the_violation(table: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = SimulatedRun(table, DeltaLedger(str(tmp_path / "_ledger")), "v", window=1)
    while run.train(6):
        run.checkpoint()
    if run.pending:
        run.checkpoint()
    code, out, _ = _run(["verify", str(tmp_path), "--output", "json"], capsys)
    assert code == 0 and json.loads(out)[0]["ok"] is True
    uri = str(tmp_path / "_ledger")
    rows = DeltaTable(uri).to_pyarrow_dataset().to_table().to_pylist()
    exact = [r for r in rows if r["record"] == "consumption"
             and r["rows"] == r["row_end"] - r["row_start"]]
    import pyarrow as pa

    from lakeckpt_tables.ledger import LEDGER_SCHEMA

    write_deltalake(uri, pa.Table.from_pylist(exact[:1], schema=LEDGER_SCHEMA), mode="append")
    code, _, err = _run(["verify", str(tmp_path), "--run", "v"], capsys)
    assert code == 1
    assert err.startswith("FAILED: overlap: run v segment 0 epoch 0: ")


def test_audit_where_names_the_runs_and_steps_that_saw_the_rows(
        root: tuple[Path, list[SimulatedRun]], table: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path, runs = root
    found = _json(["audit", str(path), "--where", "user_id = 42", "--table", str(table)], capsys)
    expected = []
    for run in runs:
        steps = [r.step for r in run.run.records
                 if any(i % 50 == 42 for i in run.run.ids[r.checkpoint_id])]
        rows = sum(sum(1 for i in run.run.ids[r.checkpoint_id] if i % 50 == 42)
                   for r in run.run.records)
        expected.append((run.run.run_id, steps[0], steps[-1], rows, len(steps)))
    assert [(r["run_id"], r["first_step"], r["last_step"], r["rows"], len(r["checkpoints"]))
            for r in found] == expected
    # run b's later checkpoints keep what its first exposed checkpoint saw
    b = found[1]
    first = [r.step for r in runs[1].run.records].index(b["first_step"])
    assert b["exposed"] == [r.checkpoint_id for r in runs[1].run.records[first:]]


def test_audit_where_rejects_a_bad_predicate_by_name(root: tuple[Path, list[SimulatedRun]],
                                                     table: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    code, _, err = _run(["audit", str(path), "--where", "no_such_column = 1", "--table",
                         str(table)], capsys)
    assert code == 2 and "no_such_column" in err and "Columns: ['id', 'user_id']" in err


def test_audit_checkpoint_and_file(root: tuple[Path, list[SimulatedRun]],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    path, runs = root
    record = runs[1].run.records[0]
    code, out, _ = _run(["audit", str(path), "--checkpoint", record.checkpoint_id, "--output",
                         "csv"], capsys)
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(parsed) == len(runs[1].run.ids[record.checkpoint_id]) == 40
    file = parsed[0]["file"]
    readers = _json(["audit", str(path), "--file", file], capsys)
    assert {r["run_id"] for r in readers} == {"a", "b"}
    assert all(r["status"] == "committed" for r in readers)


def test_tag_gc_and_maintain(table: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from lakeckpt_tables.checkpoint import CheckpointManager

    manager = CheckpointManager(tmp_path, "g", keep_last=10)
    model = torch.nn.Linear(2, 1)
    records = [manager.save(step, model=model) for step in range(1, 6)]
    (tmp_path / "g" / "step-orphan").mkdir()
    assert records[0] is not None
    tagged = _json(["tag", str(tmp_path), records[0].checkpoint_id[:12], "best"], capsys)
    assert tagged[0]["checkpoint_id"] == records[0].checkpoint_id
    shown = _json(["checkpoints", str(tmp_path)], capsys)
    assert [r["tags"] for r in shown] == [["best"], [], [], [], []]
    dry = _json(["gc", str(tmp_path), "--keep-last", "2", "--dry-run"], capsys)
    want = sorted([r.model_location for r in records[1:3] if r] + ["g/step-orphan"])
    assert sorted(r["location"] for r in dry) == want
    assert (tmp_path / "g" / "step-orphan").is_dir()
    done = _json(["gc", str(tmp_path), "--keep-last", "2"], capsys)
    assert sorted(r["location"] for r in done) == want
    assert not (tmp_path / "g" / "step-orphan").exists()
    # the checkpoints gc removed the files of are shown removed: not restorable any more
    shown = _json(["checkpoints", str(tmp_path)], capsys)
    assert [(r["step"], r["status"], r["restorable"]) for r in shown] == [
        (1, "committed", True), (2, "removed", False), (3, "removed", False),
        (4, "committed", True), (5, "committed", True)]
    compacted = _json(["maintain", str(tmp_path)], capsys)
    assert compacted[0]["rows_before"] == compacted[0]["rows_after"] == 8  # + 2 removed events
    assert len(_json(["checkpoints", str(tmp_path)], capsys)) == 5


def test_progress_plot_writes_a_png(root: tuple[Path, list[SimulatedRun]], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    out = tmp_path / "p.png"
    code, _, _ = _run(["progress", str(path), "--plot", str(out), "--output", "json"], capsys)
    assert code == 0
    import matplotlib.image

    image = matplotlib.image.imread(str(out))
    assert image.shape[:2] == (450, 800)
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_progress_watch_shows_again_until_told_to_stop(root: tuple[Path, list[SimulatedRun]],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    code, out, _ = _run(["progress", str(path), "--watch", "0.01", "--times", "3", "--output",
                         "csv"], capsys)
    assert code == 0
    assert out.count("run_id,segment,epoch") == 3
    for bad in ("0", "-1", "nan"):  # a busy loop, or a crash after the first display
        with pytest.raises(SystemExit) as exited:
            main(["progress", str(path), "--watch", bad])
        assert exited.value.code == 2
        assert "is not a number of seconds > 0" in capsys.readouterr().err


def test_audit_where_without_table_uses_each_runs_own_table(
        root: tuple[Path, list[SimulatedRun]], table: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    told = _json(["audit", str(path), "--where", "user_id = 42", "--table", str(table)], capsys)
    found = _json(["audit", str(path), "--where", "user_id = 42"], capsys)
    assert found == told and [r["run_id"] for r in found] == ["a", "b"]


def test_verify_names_its_finished_passes_readably(root: tuple[Path, list[SimulatedRun]],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = root
    code, out, _ = _run(["verify", str(path), "--output", "csv"], capsys)
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(out))}
    assert code == 0 and rows["a"]["finished_passes"] == "segment 0 epochs 0-1"
    assert rows["b"]["finished_passes"] == "none"
    verdicts = _json(["verify", str(path), "--run", "a"], capsys)
    assert verdicts[0]["finished_passes"] == [{"segment": 0, "epoch": 0},
                                              {"segment": 0, "epoch": 1}]


def test_rates_are_never_printed_in_scientific_notation(
        root: tuple[Path, list[SimulatedRun]], capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.cli._output import _text

    assert (_text(1234567.8), _text(96.5), _text(0.00012)) == ("1,234,568", "96.5", "0.00012")
    assert (_text(1234567.8, plain=True), _text(1.5e-05, plain=True)) == ("1234567.8",
                                                                           "0.000015")
    path, _ = root
    for fmt in ("table", "csv"):
        code, out, _ = _run(["progress", str(path), "--output", fmt], capsys)
        assert code == 0 and "e+" not in out and "e-" not in out


def test_an_iceberg_source_is_found_in_the_catalog_the_ledger_records_or_the_one_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np
    import pyarrow as pa

    from lakeckpt_tables import IcebergSource

    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))  # an empty default catalog
    uri = f"sqlite:///{tmp_path}/j.db"
    jcat = SqlCatalog("jcat", uri=uri, warehouse=f"file://{tmp_path}/wh")
    jcat.create_namespace("data")
    events = jcat.create_table("data.events", schema=pa.schema([("id", pa.int64())]),
                               properties={"write.parquet.row-group-limit": "25"})
    events.append(pa.table({"id": np.arange(60, dtype=np.int64)}))
    ledger = DeltaLedger(str(tmp_path / "ck" / "_ledger"))
    run = SimulatedRun(lambda: IcebergSource("data.events", catalog=jcat), ledger, "ice",
                       world=1, batch=6, window=2)
    while run.train(4):
        run.checkpoint()
    if run.pending:
        run.checkpoint()
    target = str(tmp_path / "ck")
    for command in (["verify"], ["audit", "--where", "id = 7"]):
        code, _, err = _run([*command, target], capsys)
        assert code == 2 and err.count("\n") == 1 and "--source-catalog" in err, err
        assert "'jcat'" not in err  # the catalogs searched are named: the default, not jcat
        code, _, err = _run([*command, target, "--source-catalog", uri, "--output", "json"],
                              capsys)
        assert code == 0, err
    assert _json(["verify", target, "--source-catalog", uri], capsys)[0]["ok"] is True
    assert [r["rows"] for r in _json(["audit", target, "--where", "id = 7", "--source-catalog",
                                      uri], capsys)] == [1]
    assert _run(["report", target, "-o", str(tmp_path / "r.html"), "--source-catalog", uri],
                capsys)[0] == 0
    # the ledger records the source's catalog by name: found without being told
    monkeypatch.setenv("PYICEBERG_CATALOG__JCAT__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__JCAT__URI", uri)
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    # pyiceberg reads its environment once, at import: as a new process would, read it again
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
    source = run.run.records[0].source
    assert source is not None
    ledger.record_events("ice", [LedgerEvent("source", {
        **source.to_json(), "catalog": "jcat", "identifier": "data.events"})])
    assert _json(["verify", target], capsys)[0]["ok"] is True
    assert [r["rows"] for r in _json(["audit", target, "--where", "id = 7"], capsys)] == [1]


def test_expected_failures_of_every_command_are_one_line_and_exit_2(
        root: tuple[Path, list[SimulatedRun]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    path, _ = root
    target = str(path)
    failing = [
        (["sql", target, "SELECT nope FROM checkpoints"], "nope"),
        (["tag", target, "ffffffffff", "best"], "0 checkpoints match"),
        (["audit", target, "--checkpoint", "ffffffffff"], "no checkpoint with id"),
        (["verify", target, "--checkpoint", "ffffffffff"], "no single checkpoint"),
        (["progress", target, "--plot", str(tmp_path / "no" / "dir" / "p.png")], "p.png"),
        (["report", target, "-o", str(tmp_path / "no" / "dir" / "r.html")], "r.html"),
        (["checkpoints", "iceberg:ml.nothing"], "no ledger"),
        (["maintain", str(tmp_path / "missing")], "does not exist"),
        (["gc", str(tmp_path / "missing")], "does not exist"),
        (["runs", "--catalog", "no-such-catalog"], "no-such-catalog"),
        (["verify", target, "--source-catalog", "no-such-catalog"], "no-such-catalog"),
        (["audit", target, "--where", "user_id = 1", "--table", str(tmp_path / "none")],
         str(tmp_path / "none")),
        (["progress", target, "--storage-options", "@" + str(tmp_path / "none.json")],
         "none.json cannot be read"),
    ]
    for args, named in failing:
        code, out, err = _run(args, capsys)  # an exception escaping main fails the test
        assert code == 2, (args, out, err)
        assert err.startswith(f"lakeckpt {args[0]}: error: ") and err.count("\n") == 1, err
        assert named in err, (args, err)
