"""The command line on object storage: storage options for every target, no secret echoed,
one named line for every expected failure. A real S3 server on 127.0.0.1 (tests/_s3server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _s3server
import numpy as np
import pyarrow as pa
import pytest
import torch
from _s3server import S3Server
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main
from lakeckpt_tables.cli._options import ENV_STORAGE_OPTIONS
from lakeckpt_tables.io import Storage

s3 = _s3server.s3

LAKECKPT = [sys.executable, "-m", "lakeckpt_tables.cli"]


@pytest.fixture(scope="module")
def s3_root(s3: S3Server) -> str:
    """A run with its Delta source table and its checkpoint root (ledger included) on S3."""
    options = s3.options()
    table = f"s3://{s3.bucket('src')}/t"
    ids = np.arange(120, dtype=np.int64)
    write_deltalake(table, pa.table({"id": ids, "user_id": ids % 10}), mode="append",
                    writer_properties=WriterProperties(max_row_group_size=30),
                    storage_options=Storage(table, options).delta_options())
    root = f"s3://{s3.bucket('ckpt')}/ckpt"
    loader = StatefulDataLoader(LakeDataset(DeltaSource(table, storage_options=options),
                                            columns=["id"], batch_size=10, seed=2),
                                batch_size=None)
    manager = CheckpointManager(root, "s3run", storage_options=options, keep_last=2)
    model = torch.nn.Linear(1, 1)
    for step, _ in enumerate(loader, start=1):
        manager.save(step, model=model, dataloader=loader)
        if step == 3:
            break
    return root


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS_* variable: only what a command is given reaches S3."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv(ENV_STORAGE_OPTIONS, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _lakeckpt(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(120)
def test_storage_options_reach_the_ledger_checkpoints_and_source_in_all_three_forms(
        s3_root: str, s3: S3Server, tmp_path: Path, clean_env: None,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    options = json.dumps(s3.options())
    file = tmp_path / "opts.json"
    file.write_text(options)
    for form in ("json", "file", "env"):
        args = {"json": ["--storage-options", options], "file": ["--storage-options", f"@{file}"],
                "env": []}[form]
        if form == "env":
            monkeypatch.setenv(ENV_STORAGE_OPTIONS, options)
        code, out, err = _lakeckpt(capsys, "checkpoints", s3_root, *args, "--output", "json")
        assert code == 0, err
        # retention (keep_last=2) removed step 1's model files on S3: told, not listed committed
        assert [(c["step"], c["status"]) for c in json.loads(out)] == [
            (1, "removed"), (2, "committed"), (3, "committed")], form
    monkeypatch.delenv(ENV_STORAGE_OPTIONS)
    # the source table on S3 is opened with the same options: the pass has its size
    code, out, err = _lakeckpt(capsys, "progress", s3_root, "--storage-options", options,
                               "--output", "json")
    assert code == 0, err
    assert [(p["rows_consumed"], p["rows_in_pass"]) for p in json.loads(out)] == [(30, 120)]
    code, out, err = _lakeckpt(capsys, "verify", s3_root, "--storage-options", f"@{file}")
    assert code == 0 and "s3run" in out, err
    assert s3.secret not in out + err


@pytest.mark.timeout(120)
def test_tag_gc_and_maintain_write_through_the_storage_options(
        s3: S3Server, clean_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    options = s3.options()
    root = f"s3://{s3.bucket('gc')}/ckpt"
    manager = CheckpointManager(root, "g", storage_options=options, keep_last=5)
    model = torch.nn.Linear(1, 1)
    records = [manager.save(step, model=model) for step in (1, 2, 3)]
    given = ["--storage-options", json.dumps(options), "--output", "json"]
    assert records[0] is not None
    code, out, err = _lakeckpt(capsys, "tag", root, records[0].checkpoint_id, "best", *given)
    assert code == 0, err
    code, out, err = _lakeckpt(capsys, "gc", root, "--keep-last", "1", *given)
    assert code == 0, err
    assert [r["location"] for r in json.loads(out)] == [records[1].model_location]
    assert not Storage(root, options).exists(records[1].model_location)
    code, out, err = _lakeckpt(capsys, "checkpoints", root, *given)
    assert [(c["step"], c["status"], c["tags"]) for c in json.loads(out)] == [
        (1, "committed", ["best"]), (2, "removed", []), (3, "committed", [])]
    code, out, err = _lakeckpt(capsys, "maintain", root, *given)
    assert code == 0 and json.loads(out)[0]["rows_after"] == 5, err  # 3 + tag + removed


@pytest.mark.timeout(120)
def test_an_s3_root_without_options_is_one_line_telling_how_to_pass_them(
        s3_root: str, clean_env: None) -> None:
    # a process of its own: what reaches the terminal, traceback or not
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([*LAKECKPT, "checkpoints", s3_root], capture_output=True, text=True,
                          timeout=90, env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("lakeckpt checkpoints: error: ")
    assert "--storage-options" in done.stderr and ENV_STORAGE_OPTIONS in done.stderr


@pytest.mark.timeout(120)
def test_no_credential_is_echoed_by_a_failure_even_about_the_options(
        s3_root: str, s3: S3Server, clean_env: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    wrong = s3.options(AWS_SECRET_ACCESS_KEY="wrong-secret-0d9e7f",
                       AWS_ACCESS_KEY_ID="wrong-key-5a1b2c")
    missing = s3_root.replace("s3://", "s3://no-such-bucket-")
    code, _, err = _lakeckpt(capsys, "checkpoints", missing, "--storage-options",
                             json.dumps(wrong))
    assert code == 2 and err.count("\n") == 1 and "no-such-bucket-" in err, err
    assert "wrong-secret-0d9e7f" not in err and "wrong-key-5a1b2c" not in err
    # malformed options holding a secret: the error says where and what, never the text
    broken = json.dumps(s3.options())[:-1]
    code, _, err = _lakeckpt(capsys, "progress", s3_root, "--storage-options", broken)
    assert code == 2 and "--storage-options is not valid JSON" in err
    assert s3.secret not in err and s3.key not in err
    monkeypatch.setenv(ENV_STORAGE_OPTIONS, "[1]")
    code, _, err = _lakeckpt(capsys, "progress", s3_root)
    assert code == 2 and "$LAKECKPT_STORAGE_OPTIONS must be a JSON object" in err
    # a catalog URI with a password that fails is named without its password
    code, _, err = _lakeckpt(capsys, "runs", "--catalog",
                             "postgresql+psycopg://lakeckpt:hunter2-pass@127.0.0.1:1/nowhere")
    assert code == 2 and err.count("\n") == 1, err
    assert "hunter2-pass" not in err and "lakeckpt:***@127.0.0.1" in err


def _help(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("name", ["checkpoints", "progress", "audit", "verify", "sql", "tag",
                                  "gc", "maintain", "report", "runs"])
def test_the_help_of_each_command_documents_storage_options(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(name, capsys)
    assert "--storage-options JSON|@FILE" in text and "LAKECKPT_STORAGE_OPTIONS" in text
    if name in ("audit", "verify", "report"):
        assert "--source-catalog NAME|URI" in text


