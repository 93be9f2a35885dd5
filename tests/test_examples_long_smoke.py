"""The long examples (follow mode under SIGKILL, the pre-training mixture under torchrun) run as
written: a file apart from tests/test_examples_smoke.py, so the suite's processes share them."""

from __future__ import annotations

import pytest
from test_examples_smoke import SMALL_FOLLOW, run_example


@pytest.mark.slow
@pytest.mark.timeout(240)  # a writer and two trainers, ~30 s on 2 busy cores; 130 s at load 9
def test_follow_delta_survives_a_sigkill_while_the_table_grows() -> None:
    # without DataLoader workers: tests/test_follow_crash.py kills a follower that has them
    lines = run_example("follow_delta.py", *SMALL_FOLLOW, "--workers", "0")
    text = "\n".join(lines)
    assert "SIGKILLed" in text
    assert "skipped commit: version" in text and "OPTIMIZE" in text
    assert "ids: 520 rows (200 pinned + 320 appended), 520 trained, 0 duplicated, 0 missing: " \
           "OK" in text


@pytest.mark.slow
@pytest.mark.timeout(240)  # as above
def test_follow_iceberg_survives_a_sigkill_while_the_table_grows() -> None:
    lines = run_example("follow_iceberg.py", *SMALL_FOLLOW, "--max-idle", "2")
    text = "\n".join(lines)
    assert "SIGKILLed" in text
    assert "skipped commit: version" in text and "delete" in text
    assert "ledger segments: 4 segments tile" in text


@pytest.mark.timeout(240)  # two 2-rank torchrun jobs, ~30 s on 2 busy cores
def test_pretrain_mixture_trains_every_token_once_in_order_across_a_sigkill() -> None:
    lines = run_example("pretrain_mixture.py")
    assert any(x.startswith("job 1: SIGKILLed") for x in lines)
    assert any(x.startswith("job 2: restored step 10") for x in lines)
    assert sum(x.endswith("same batches, same order") for x in lines) == 2
    assert any(x.startswith("tokens: ") and x.endswith("0 twice, 0 missing: OK") for x in lines)
    assert sum(x.startswith("ledger ") and x.endswith(": OK") for x in lines) == 2
    assert any(x.startswith("verify run pretrain") and x.endswith("0 violations: OK")
               for x in lines)


@pytest.mark.slow
@pytest.mark.timeout(240)  # two trainers and a SIGKILL, ~15 s on 2 busy cores (8.6 s of CPU)
def test_forget_user_stops_exposure_at_the_next_checkpoint_through_a_sigkill() -> None:
    lines = run_example("forget_user.py")
    text = "\n".join(lines)
    assert "user 42's rows deleted (deletion vectors, version 3)" in text
    assert "SIGKILLed" in text
    assert "exposure stopped after step 15" in text
