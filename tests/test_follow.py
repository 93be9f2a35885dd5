"""Follow mode (Guarantee 4, Continuation): real tables, real writers, unique int64 ids.

A follower reads its pinned snapshot, then segment after segment the rows appended since:
segment ``k`` spans the commits after segment ``k - 1`` up to the first at which at least
``min_segment_rows`` appended rows accumulated, or ``until_version`` (NOTE [ segment boundaries ]
in ``lakeckpt_tables/reader/rounds.py``). These tests prove, from ids and from the ledger, that
every appended row is delivered exactly once, that segments are what the commit log alone says
(so a resume, in whatever process and at whatever time, continues the same sequence), that
OPTIMIZE / Iceberg ``replace`` commits are skipped and recorded, that deletes and overwrites
follow the ``on_change`` policy, and that a follower stops where it is told to.

The SIGKILLed multi-rank ``torchrun`` runs are in ``test_follow_crash.py``.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import flat, loader_for, raised_in_workers, sql_catalog, take

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import ResumePathError, SourceChangedError
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once
from lakeckpt_tables.reader import encode_state, merge_states, states_from_loader

JOBS = Path(__file__).parent / "jobs"
_spec = importlib.util.spec_from_file_location("follow_writer", JOBS / "writer.py")
assert _spec is not None and _spec.loader is not None
writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writer)

T = TypeVar("T")

TINY_COMMITS = 300
"""Appends of 1-3 rows each after version 0 in the ``tiny`` table."""


# ------------------------------------------------------------------------------ tables


@dataclass
class Written:
    """What a writer committed: the oracle the reader is checked against."""

    uri: str
    appended: dict[int, tuple[int, int]] = field(default_factory=dict)  # version -> ids [lo, hi)
    other: dict[int, str] = field(default_factory=dict)  # version -> operation (not an append)

    @property
    def end(self) -> int:
        return max([*self.appended, *self.other])

    def ids(self, base: int = -1, to: int | None = None) -> list[int]:
        """Ids appended by the commits in ``(base, to]``."""
        to = self.end if to is None else to
        return [i for v, (lo, hi) in sorted(self.appended.items()) if base < v <= to
                for i in range(lo, hi)]

    def rows(self, version: int) -> int:
        lo, hi = self.appended.get(version, (0, 0))
        return hi - lo

    def segments(self, start: int, end: int, min_rows: int) -> list[tuple[int, int, int]]:
        """``(base, to, rows)`` of each segment after ``start``, derived from the log alone."""
        out, base, rows = [], start, 0
        for version in range(start + 1, end + 1):
            rows += self.rows(version)
            if rows >= min_rows or version == end:
                out.append((base, version, rows))
                base, rows = version, 0
        return out

    def segment_of(self, start: int, end: int, min_rows: int) -> dict[int, int]:
        """Id -> the segment (0: the pinned snapshot) that holds it."""
        label = {i: 0 for i in self.ids(-1, start)}
        for k, (base, to, _) in enumerate(self.segments(start, end, min_rows), 1):
            label.update({i: k for i in self.ids(base, to)})
        return label


def _append(written: Written, lo: int, hi: int) -> int:
    version = writer.append(written.uri, lo, hi)
    written.appended[version] = (lo, hi)
    return version


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Written:
    """Version 0 with 20 rows, then ``TINY_COMMITS`` appends of 1-3 rows each."""
    from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

    written = Written(str(tmp_path_factory.mktemp("tiny") / "table"))
    _append(written, 0, 20)
    dt = DeltaTable(written.uri)
    hook = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    sizes = np.random.default_rng(11).integers(1, 4, TINY_COMMITS)
    lo = 20
    for n in sizes.tolist():
        write_deltalake(dt, writer.batch(lo, lo + n), mode="append",
                        post_commithook_properties=hook)
        written.appended[dt.version()] = (lo, lo + n)
        lo += n
    assert written.end == TINY_COMMITS
    return written


def _follow(written: Written, **kwargs: Any) -> LakeDataset:
    args: dict[str, Any] = {"columns": ["id"], "batch_size": 3, "seed": 5, "shuffle_window": 2,
                            "follow": True, "version": 0, "until_version": written.end,
                            "poll_interval": 0.01, "min_segment_rows": 16}
    args.update(kwargs)
    return LakeDataset(DeltaSource(written.uri), **args)


def _bounded(fn: Callable[[], T], seconds: float = 60.0) -> T:
    """``fn()`` in a thread: a follower that never stops fails the test instead of hanging it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the follower did not stop within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _assert_exactly_once(delivered: list[int], expected: list[int]) -> None:
    verdict = check_exactly_once(delivered, expected)
    assert verdict, str(verdict)


def _loader_state(loader: Any) -> dict[str, Any]:
    """A loader's state as a checkpoint keeps it: through JSON, never pickled."""
    state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    return state


# ------------------------------------------------------------------------------ ledger


def _follow_with_checkpoints(dataset: LakeDataset, root: Path, *, every: int = 3,
                             workers: int = 0) -> list[list[int]]:
    """A world-of-one training loop: CheckpointManager saves every ``every`` steps."""
    loader = loader_for(dataset, workers)
    manager = CheckpointManager(root, "run")
    step = manager.restore(dataloader=loader) or 0
    saved, batches = step, []
    for batch in loader:
        step += 1
        batches.append(batch["id"].tolist())
        if step % every == 0:
            manager.save(step, dataloader=loader)
            saved = step
    if saved != step:
        manager.save(step, dataloader=loader, tags=("final",))
    return batches


def ledger_events(root: Path, name: str) -> list[dict[str, Any]]:
    """Details of the run's ledger events called ``name``, oldest checkpoint first."""
    table = DeltaLedger(str(root / "_ledger")).to_arrow()
    rows = table.filter(pc.and_(pc.equal(table["record"], "event"),
                                pc.equal(table["event"], name))).to_pylist()
    rows.sort(key=lambda r: r["step"])
    return [json.loads(r["detail"]) for r in rows]


def assert_segment_events(root: Path, expected: list[tuple[int, int, int]]) -> None:
    """The ledger names every segment once, chained version to version, with its rows."""
    found = [(e["from_version"], e["to_version"], e["rows"])
             for e in ledger_events(root, "segment")]
    assert found == expected


def delta_units(written: Written, start: int, versions: list[int]) -> Counter[tuple[str, int]]:
    """Rows of every row group the follower must read: the files of the pinned version and
    those each append in ``versions`` added, listed with deltalake and the Parquet footers."""
    from deltalake import DeltaTable

    def files(version: int) -> set[str]:
        adds = pa.table(DeltaTable(written.uri, version=version).get_add_actions(flatten=True))
        return {f"{written.uri}/{p}" for p in adds.column("path").to_pylist()}

    paths = set(files(start))
    for version in versions:
        paths |= files(version) - files(version - 1)
    out: Counter[tuple[str, int]] = Counter()
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            out[(path, g)] += meta.row_group(g).num_rows
    return out


def ledger_units(root: Path) -> Counter[tuple[str, int]]:
    out: Counter[tuple[str, int]] = Counter()
    for rec in DeltaLedger(str(root / "_ledger")).consumption(run_id="run").to_pylist():
        out[(os.path.realpath(rec["file"]), rec["row_group"])] += rec["rows"]
    return out


def realpaths(units: Counter[tuple[str, int]]) -> Counter[tuple[str, int]]:
    return Counter({(os.path.realpath(p), g): n for (p, g), n in units.items()})


# --------------------------------------------------------------- 3. many tiny appends


@pytest.mark.parametrize("min_rows", [1, 7, 40])
def test_segments_of_tiny_appends_end_at_the_first_commit_reaching_min_segment_rows(
        tiny: Written, min_rows: int) -> None:
    """Read in one process without workers, a segment's rows come out as one block: the blocks
    must be exactly the rows of the commits the log assigns to each segment."""
    segments = tiny.segments(0, tiny.end, min_rows)
    assert all(rows >= min_rows for _, _, rows in segments[:-1])
    assert all(rows - tiny.rows(to) < min_rows for _, to, rows in segments), "first commit"
    delivered = flat(take(loader_for(_follow(tiny, min_segment_rows=min_rows), 0)))
    _assert_exactly_once(delivered, tiny.ids())
    blocks, at = [sorted(delivered[:20])], 20
    for _, _, rows in segments:
        blocks.append(sorted(delivered[at:at + rows]))
        at += rows
    assert blocks == [tiny.ids(-1, 0)] + [tiny.ids(base, to) for base, to, _ in segments]


def _labels(batches: list[list[int]], segment_of: dict[int, int]) -> list[int]:
    """The segment of each batch; a batch never mixes segments."""
    out = []
    for batch in batches:
        segments = {segment_of[i] for i in batch}
        assert len(segments) == 1, f"a batch mixes segments {segments}"
        out.append(segments.pop())
    return out


def _cut(labels: list[int], where: str) -> int:
    """A step in the second half of the run: right at a segment boundary, or inside one."""
    half = len(labels) // 2
    for step in range(half, len(labels)):
        boundary = labels[step - 1] != labels[step]
        inside = labels[step - 1] == labels[step]
        if (where == "between" and boundary) or (where == "inside" and inside):
            return step
    raise AssertionError(f"no {where} step in {labels}")


@pytest.mark.parametrize("where", ["between", "inside"])
@pytest.mark.parametrize(("world_size", "workers"), [(1, 0), (1, 2), (2, 0), (2, 2)])
def test_a_crash_between_or_inside_segments_resumes_into_the_uninterrupted_sequence(
        tiny: Written, world_size: int, workers: int, where: str) -> None:
    def dataset(rank: int) -> LakeDataset:
        return _follow(tiny, rank=rank, world_size=world_size)

    runs = [take(loader_for(dataset(r), workers)) for r in range(world_size)]
    _assert_exactly_once(flat(b for run in runs for b in run), tiny.ids())
    segment_of = tiny.segment_of(0, tiny.end, 16)
    labels = [_labels(run, segment_of) for run in runs]
    assert all(lab == labels[0] for lab in labels), "ranks must step through segments together"
    step = _cut(labels[0], where)
    for rank, full in enumerate(runs):
        loader = loader_for(dataset(rank), workers)
        head = take(loader, step)
        assert head == full[:step], "a second run repeats the first, batch for batch"
        saved = _loader_state(loader)
        del loader
        # as CheckpointManager.restore does: the dataset loads the loader's state
        resumed = dataset(rank)
        resumed.load_state_dict(saved)
        assert head + take(loader_for(resumed, workers)) == full
        # and the loader restores itself
        again = loader_for(dataset(rank), workers)
        again.load_state_dict(saved)
        assert head + take(again) == full


def test_a_follower_built_for_the_latest_version_resumes_from_the_version_its_state_pinned(
        tiny: Written) -> None:
    full = take(loader_for(_follow(tiny, until_version=120), 0))
    loader = loader_for(_follow(tiny, until_version=120), 0)
    head = take(loader, 30)
    saved = _loader_state(loader)
    for workers in (0, 2):  # the same slice, or re-planned over two workers
        resumed = _follow(tiny, until_version=120, version=None)  # pins the latest: 300
        assert resumed.snapshot.version == tiny.end
        resumed.load_state_dict(saved)
        rest = take(loader_for(resumed, workers))
        if workers == 0:
            assert head + rest == full
        _assert_exactly_once(flat(head + rest), tiny.ids(-1, 120))


# ------------------------------------------------------------------------ 4. elastic


@pytest.mark.parametrize(("workers", "new_workers"), [(0, 0), (2, 1)])
def test_a_follow_run_resumed_at_three_ranks_from_two_delivers_every_row_exactly_once(
        tiny: Written, workers: int, new_workers: int) -> None:
    heads, states = [], []
    for rank in range(2):
        loader = loader_for(_follow(tiny, rank=rank, world_size=2), workers)
        heads.append(take(loader, 41))  # mid-segment, well into the follow segments
        states.extend(states_from_loader(_loader_state(loader)))
    merged = merge_states(states).to_dict()
    assert merged["rounds"], "a follow state names the segments its slices stand in"
    rest = []
    for rank in range(3):
        dataset = _follow(tiny, rank=rank, world_size=3)
        dataset.load_state_dict(merged)
        rest.append(take(loader_for(dataset, new_workers)))
    assert len({len(run) for run in rest}) == 1, "three ranks in lockstep after the re-plan"
    delivered = flat(b for run in heads + rest for b in run)
    _assert_exactly_once(delivered, tiny.ids())


def test_an_elastic_follow_resume_with_the_default_min_segment_rows_keeps_the_runs_segments(
        tiny: Written) -> None:
    """The default, world size x batch size, changes with the shape: a resumed reader left to
    the default adopts the state's, so that the segments still ahead are the run's."""
    def follower(rank: int, world_size: int, batch_size: int) -> LakeDataset:
        return _follow(tiny, rank=rank, world_size=world_size, batch_size=batch_size,
                       min_segment_rows=None)

    segment_of = tiny.segment_of(0, tiny.end, 8)
    assert tiny.segments(0, tiny.end, 8)[-1][2] >= 3, "every segment has a row for each rank"
    # cut between two segments: a remnant smaller than 3 ranks would not be delivered
    # (test_every_row_up_to_until_version_reaches_some_rank_even_when_rows_are_fewer_than_slices)
    step = _cut(_labels(take(loader_for(follower(0, 2, 4), 0)), segment_of), "between")
    heads, states = [], []
    for rank in range(2):  # min_segment_rows = 2 x 4
        loader = loader_for(follower(rank, 2, 4), 0)
        heads.append(take(loader, step))
        states.extend(states_from_loader(_loader_state(loader)))
    merged = merge_states(states).to_dict()
    rest = []
    for rank in range(3):  # the default here would be 3 x 5
        dataset = follower(rank, 3, 5)
        dataset.load_state_dict(merged)
        rest.append(take(loader_for(dataset, 0)))
    _assert_exactly_once(flat(b for run in heads + rest for b in run), tiny.ids())
    for run in rest:
        _labels(run, segment_of)  # no batch straddles a segment of 8 rows


# ----------------------------------------------------------------- 6. state stays small


def _merged(loader_states: list[dict[str, Any]]) -> Any:
    return merge_states(s for state in loader_states for s in states_from_loader(state))


def test_the_reader_state_stays_small_over_hundreds_of_segments(tiny: Written) -> None:
    early, late = [], []
    for rank in range(2):
        dataset = _follow(tiny, rank=rank, world_size=2, batch_size=2, min_segment_rows=2)
        loader = loader_for(dataset, 0)
        for step, _ in enumerate(loader, 1):
            if step == 10:
                early.append(_loader_state(loader))
        late.append(_loader_state(loader))
    segments = len(tiny.segments(0, tiny.end, 2))
    assert segments > 200
    assert max(r for r, _ in _merged(late).positions()) > 200, "hundreds of segments in"
    assert max(r for r, _ in _merged(early).positions()) < 10
    small, big = encode_state(_merged(early)), encode_state(_merged(late))
    assert len(big) < 2048, big
    assert len(big) <= len(small) + 16, (len(small), len(big))


# ---------------------------------------------------------------------- 7. stopping


def test_until_version_ends_the_pass_before_later_commits(tiny: Written) -> None:
    delivered = _bounded(lambda: flat(take(loader_for(_follow(tiny, until_version=150), 0))))
    _assert_exactly_once(delivered, tiny.ids(-1, 150))


def test_a_resumed_follower_after_until_version_yields_nothing_more(tiny: Written) -> None:
    for workers in (0, 2):
        loader = loader_for(_follow(tiny, until_version=60), workers)
        _assert_exactly_once(flat(take(loader)), tiny.ids(-1, 60))
        saved = _loader_state(loader)
        resumed = _follow(tiny, until_version=60)
        resumed.load_state_dict(saved)
        assert _bounded(lambda r=resumed, w=workers: take(loader_for(r, w))) == []
        # torchdata's own resume would start the finished pass afresh in new workers
        again = loader_for(_follow(tiny, until_version=60), workers)
        again.load_state_dict(saved)
        if workers:
            with raised_in_workers(ResumePathError, "at the end of its pass"):
                take(again)
        else:
            assert _bounded(lambda a=again: take(a)) == []


def _short_segments_table(tmp_path: Path) -> Written:
    """Version 0 and version 2 hold one row each: fewer than two ranks can share."""
    written = Written(str(tmp_path / "table"))
    for lo, hi in ((0, 1), (1, 4), (4, 5)):
        _append(written, lo, hi)
    return written


def _two_ranks(written: Written) -> list[list[list[int]]]:
    return [take(loader_for(LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=2,
                                        version=0, follow=True, until_version=written.end,
                                        min_segment_rows=2, rank=rank, world_size=2), 0))
            for rank in range(2)]


def test_the_tail_of_a_segment_too_small_for_every_rank_is_carried_into_the_next_segment(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # version 0: id 0, version 1: ids 1-3, version 2: id 4. Two ranks: the pinned snapshot's
    # lone row goes to the head of segment 1 (4 rows, 2 per rank); segment 2's lone row is
    # the tail the pass ends with: not delivered, said so once
    written = _short_segments_table(tmp_path)
    runs = _bounded(lambda: _two_ranks(written))
    assert [len(run) for run in runs] == [1, 1], "ranks in lockstep, one batch each"
    _assert_exactly_once(flat(b for run in runs for b in run), written.ids(-1, 1))
    warned = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(warned) == 1 and "segment 2 epoch 0: 1 row(s)" in warned[0], warned
    assert "as the pass ends here" in warned[0]


def test_a_tail_the_pass_ended_with_is_delivered_first_when_following_resumes_past_it(
        tmp_path: Path) -> None:
    written = _short_segments_table(tmp_path)
    states = []
    for rank in range(2):  # each rank's pass ends at version 2, id 4 not delivered
        loader = loader_for(LakeDataset(
            DeltaSource(written.uri), columns=["id"], batch_size=2, version=0, follow=True,
            until_version=written.end, min_segment_rows=2, rank=rank, world_size=2), 0)
        head = _bounded(lambda loader=loader: take(loader))
        states.append((head, _loader_state(loader)))
    assert sorted(flat(b for head, _ in states for b in head)) == written.ids(-1, 1)
    _append(written, 5, 8)  # version 3: segment 3 = id 4 carried + ids 5-7
    rest = []
    for rank, (_, saved) in enumerate(states):
        dataset = LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=2,
                              follow=True, until_version=written.end, min_segment_rows=2,
                              rank=rank, world_size=2)
        dataset.load_state_dict(saved)
        rest.append(_bounded(lambda dataset=dataset: take(loader_for(dataset, 0))))
    assert [len(run) for run in rest] == [1, 1], "ranks in lockstep"
    assert 4 in flat(rest[0]) + flat(rest[1])
    _assert_exactly_once(flat(b for head, _ in states for b in head) + flat(
        b for run in rest for b in run), written.ids())


def test_the_remnant_of_an_elastic_resume_too_small_for_the_new_ranks_is_carried(
        tmp_path: Path) -> None:
    written = _short_segments_table(tmp_path)
    _append(written, 5, 25)

    def follower(rank: int, world_size: int) -> LakeDataset:
        return LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=2, version=1,
                           follow=True, until_version=written.end, min_segment_rows=3,
                           rank=rank, world_size=world_size)

    # pinned version 1: 4 rows in 2 batches; segment 1 = (1, 3]: 21 rows in 11 batches
    loader = loader_for(follower(0, 1), 0)
    head = take(loader, 12)  # all but 1 row of segment 1: 3 ranks cannot share it
    saved = _loader_state(loader)
    _append(written, 25, 31)  # segment 2 = the carried row + 6 rows: 7 rows over 3 ranks
    rest = []
    for rank in range(3):
        dataset = follower(rank, 3)
        dataset.load_state_dict(saved)
        rest.append(_bounded(lambda dataset=dataset: take(loader_for(dataset, 0))))
    assert [len(run) for run in rest] == [2, 2, 2], "ranks in lockstep"
    _assert_exactly_once(flat(head + [b for run in rest for b in run]), written.ids())


def test_max_idle_with_several_ranks_is_refused(tiny: Written) -> None:
    with pytest.raises(ValueError, match="max_idle"):
        _follow(tiny, rank=0, world_size=2, max_idle=1.0, until_version=None)


@pytest.mark.parametrize(("world_size", "workers"), [(2, 0), (1, 2), (2, 2)])
def test_min_segment_rows_below_ranks_times_workers_is_refused_naming_it(
        tiny: Written, world_size: int, workers: int) -> None:
    dataset = _follow(tiny, rank=0, world_size=world_size,
                      min_segment_rows=world_size * max(workers, 1) - 1)
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="min_segment_rows"):
        take(loader_for(dataset, workers))
    # the loader's workers outlive a failed start by seconds: end them (ours only) now
    for process in set(multiprocessing.active_children()) - before:
        process.terminate()
        process.join()


def test_max_idle_ends_a_pass_and_a_resume_reads_the_rows_appended_since(
        tmp_path: Path) -> None:
    """The rows of a segment still short of min_segment_rows when the pass idles out are not
    lost: the next pass forms that segment from the log, identically."""
    written = Written(str(tmp_path / "table"))
    _append(written, 0, 30)
    _append(written, 30, 34)

    def follower() -> LakeDataset:
        return LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=4, version=0,
                           follow=True, min_segment_rows=10, max_idle=0.3, poll_interval=0.02)

    loader = loader_for(follower(), 0)
    started = time.monotonic()
    first = flat(_bounded(lambda: take(loader)))
    assert time.monotonic() - started >= 0.3
    _assert_exactly_once(first, written.ids(-1, 0))  # 4 rows appended: segment 1 not formed
    saved = _loader_state(loader)
    for lo in (34, 37, 40):
        _append(written, lo, lo + 3)
    resumed = follower()
    resumed.load_state_dict(saved)
    second = flat(_bounded(lambda: take(loader_for(resumed, 0))))
    # segment 1 is (0, 3]: 4 + 3 + 3 rows; version 4's 3 rows wait for 7 more
    assert sorted(second) == written.ids(0, 3)
    _assert_exactly_once(first + second, written.ids(-1, 3))


def _wait_for_version(uri: str, version: int, timeout: float = 60.0) -> None:
    log = Path(uri) / "_delta_log" / f"{version:020d}.json"
    deadline = time.monotonic() + timeout
    while not log.exists():
        assert time.monotonic() < deadline, f"the writer committed no version {version}"
        time.sleep(0.02)


def _start_writer(table: str, first_id: int, appends: int, go: Path, *, rows: int = 6,
                  interval: float = 0.05, optimize_after: int | None = None
                  ) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(JOBS / "writer.py"), "--table", table, "--first-id",
           str(first_id), "--appends", str(appends), "--rows", str(rows), "--interval",
           str(interval), "--go", str(go)]
    if optimize_after is not None:
        cmd += ["--optimize-after", str(optimize_after)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _writer_log(proc: subprocess.Popen[str], written: Written) -> None:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    parse_writer_output(out, written)


def parse_writer_output(out: str, written: Written) -> None:
    """Record the commits ``tests/jobs/writer.py`` printed."""
    for line in out.splitlines():
        kind, *values = line.split()
        if kind == "append":
            written.appended[int(values[0])] = (int(values[1]), int(values[2]))
        elif kind == "optimize":
            written.other[int(values[0])] = "OPTIMIZE"


def test_max_idle_follows_a_writer_process_and_ends_the_pass_once_it_stops(
        tmp_path: Path) -> None:
    written = Written(str(tmp_path / "table"))
    _append(written, 0, 10)
    proc = _start_writer(written.uri, 10, 15, tmp_path / "go")
    dataset = LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=4, version=0,
                          follow=True, min_segment_rows=1, max_idle=3.0, poll_interval=0.02)
    (tmp_path / "go").touch()
    # the idle clock must measure the gaps between commits, not the writer's start-up (a new
    # interpreter importing deltalake takes seconds on a busy machine): wait for its first
    _wait_for_version(written.uri, 1)
    delivered = flat(_bounded(lambda: take(loader_for(dataset, 0))))
    _writer_log(proc, written)
    assert written.end == 15
    _assert_exactly_once(delivered, written.ids())


# ------------------------------------------------------------ 2. OPTIMIZE, DELETE, overwrite


def test_an_optimize_while_following_rereads_no_row_and_the_ledger_records_it_skipped(
        tmp_path: Path) -> None:
    written = Written(str(tmp_path / "table"))
    _append(written, 0, 12)
    go = tmp_path / "go"
    proc = _start_writer(written.uri, 12, 12, go, rows=5, optimize_after=6)
    end = 13  # 12 appends and the OPTIMIZE
    dataset = LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=4, seed=1,
                          version=0, follow=True, until_version=end, poll_interval=0.02,
                          min_segment_rows=9)
    go.touch()
    root = tmp_path / "ckpt"
    batches = _bounded(lambda: _follow_with_checkpoints(dataset, root, every=2))
    _writer_log(proc, written)
    assert written.end == end and list(written.other.values()) == ["OPTIMIZE"]
    optimize = next(iter(written.other))
    _assert_exactly_once(flat(batches), written.ids())
    assert_segment_events(root, written.segments(0, end, 9))
    skipped = ledger_events(root, "skipped_commit")
    assert [e["version"] for e in skipped] == [optimize]
    assert "OPTIMIZE" in skipped[0]["reason"]
    expected = delta_units(written, 0, sorted(written.appended)[1:])
    assert realpaths(ledger_units(root)) == realpaths(expected)


def _changed_table(tmp_path: Path, change: str) -> Written:
    """Versions 0-2 appends, 3 a DELETE or an overwrite, 4-5 appends."""
    from deltalake import DeltaTable, write_deltalake

    written = Written(str(tmp_path / "table"))
    for lo in (0, 20, 30):
        _append(written, lo, lo + (20 if lo == 0 else 10))
    if change == "delete":
        DeltaTable(written.uri).delete("id < 5")
    else:
        write_deltalake(written.uri, writer.batch(1000, 1007), mode="overwrite")
    operation = DeltaTable(written.uri).history(1)[0]["operation"]
    written.other[3] = operation
    for lo in (40, 50):
        _append(written, lo, lo + 10)
    assert written.end == 5
    return written


def _changed_follower(written: Written, on_change: str) -> LakeDataset:
    return LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=4, version=0,
                       follow=True, until_version=written.end, poll_interval=0.02,
                       min_segment_rows=8, on_change=on_change)  # type: ignore[arg-type]


@pytest.mark.parametrize("change", ["delete", "overwrite"])
def test_a_delete_or_overwrite_fails_by_default_naming_table_version_and_operation(
        tmp_path: Path, change: str) -> None:
    written = _changed_table(tmp_path, change)
    operation = written.other[3]
    assert operation == ("DELETE" if change == "delete" else "WRITE")
    delivered: list[int] = []

    def read() -> None:
        for batch in loader_for(_changed_follower(written, "fail"), 0):
            delivered.extend(batch["id"].tolist())

    with pytest.raises(SourceChangedError) as info:
        _bounded(read)
    message = str(info.value)
    assert written.uri in message and "version 3" in message and operation in message
    # segments 1 = (0, 1] and 2 = (1, 2] were delivered; the one holding version 3 fails
    _assert_exactly_once(delivered, written.ids(-1, 2))


@pytest.mark.parametrize("change", ["delete", "overwrite"])
def test_a_delete_or_overwrite_is_skipped_on_request_and_the_ledger_records_it(
        tmp_path: Path, change: str) -> None:
    written = _changed_table(tmp_path, change)
    root = tmp_path / "ckpt"
    batches = _bounded(lambda: _follow_with_checkpoints(_changed_follower(written, "skip"),
                                                        root, every=2))
    _assert_exactly_once(flat(batches), written.ids())  # the overwrite's rows are not read
    skipped = ledger_events(root, "skipped_commit")
    assert [e["version"] for e in skipped] == [3]
    assert written.other[3] in skipped[0]["reason"]
    assert_segment_events(root, [(0, 1, 10), (1, 2, 10), (2, 4, 10), (4, 5, 10)])
    assert realpaths(ledger_units(root)) == realpaths(delta_units(written, 0, [1, 2, 4, 5]))


def test_a_run_stopped_by_on_change_fail_resumes_with_skip_and_the_ledger_records_the_change(
        tmp_path: Path) -> None:
    """Issue 8 item 7: options that do not define the rows may change on resume; the ledger
    names the change, every round once, and the rows still add up exactly once."""
    written = _changed_table(tmp_path, "delete")
    root = tmp_path / "ckpt"
    with pytest.raises(SourceChangedError, match="version 3"):
        _bounded(lambda: _follow_with_checkpoints(_changed_follower(written, "fail"), root,
                                                  every=2))
    _bounded(lambda: _follow_with_checkpoints(_changed_follower(written, "skip"), root,
                                              every=2))
    assert ledger_events(root, "policy_change") == [
        {"option": "on_change", "old": "fail", "new": "skip"}]
    assert realpaths(ledger_units(root)) == realpaths(delta_units(written, 0, [1, 2, 4, 5]))
    rounds = ledger_events(root, "round")
    assert [(r["round"], r["segment"], r["base_version"], r["version"], r["rows"],
             r["delivered"]) for r in rounds] == [
        (0, 0, None, 0, 20, 20), (1, 1, 0, 1, 10, 10), (2, 2, 1, 2, 10, 10),
        (3, 3, 2, 4, 10, 10), (4, 4, 4, 5, 10, 10)]


def test_on_change_stop_ends_the_pass_before_the_change_and_a_final_save_records_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32 item 4: no error mid-step; the rows before the commit are trained and the final
    save records them; a resume with on_change='skip' goes on past it, each row once."""
    written = _changed_table(tmp_path, "delete")
    root = tmp_path / "ckpt"
    with caplog.at_level("WARNING", logger="lakeckpt_tables"):
        before = _bounded(lambda: _follow_with_checkpoints(_changed_follower(written, "stop"),
                                                           root, every=2))
    _assert_exactly_once(flat(before), written.ids(-1, 2))  # versions 0-2, nothing after
    (said,) = {r.getMessage() for r in caplog.records if "on_change='stop'" in r.getMessage()}
    assert "version 3 (DELETE)" in said and "ends at version 2" in said
    assert realpaths(ledger_units(root)) == realpaths(delta_units(written, 0, [1, 2]))
    after = _bounded(lambda: _follow_with_checkpoints(_changed_follower(written, "skip"), root,
                                                      every=2))
    _assert_exactly_once(flat(before) + flat(after), written.ids())
    assert realpaths(ledger_units(root)) == realpaths(delta_units(written, 0, [1, 2, 4, 5]))


# ------------------------------------------------------------------------- 5. Iceberg

ICEBERG_ID = "follow.rows"


def _iceberg_append(table: Any, written: Written, lo: int, hi: int) -> Any:
    table.append(writer.batch(lo, hi).cast(_iceberg_schema()))
    table = table.refresh()
    written.appended[table.current_snapshot().snapshot_id] = (lo, hi)
    return table


def _iceberg_schema() -> pa.Schema:
    # Iceberg has no fixed-size lists: x is stored as list<float>
    return pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32())), ("y", pa.float32())])


def _iceberg_table(catalog: Any) -> Any:
    catalog.create_namespace_if_not_exists("follow")
    return catalog.create_table(ICEBERG_ID, schema=_iceberg_schema(),
                                properties={"write.parquet.row-group-limit": "6"})


def iceberg_rewrite(table: Any, files: list[Any]) -> int:
    """Commit a ``replace`` snapshot: ``files`` compacted into one file with the same rows.

    pyiceberg 0.12 writes append, overwrite and delete snapshots only (its snapshot summary
    code refuses ``replace``), so this commits what Iceberg's RewriteFiles commits: the
    overwrite producer of the Transaction API, removing ``files`` and adding their rows,
    under the ``replace`` operation.
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class _Rewrite(_OverwriteFiles):
        def _summary(self, snapshot_properties: Any = None) -> Summary:
            summary = super()._summary(snapshot_properties or {})
            return Summary(Operation.REPLACE, **summary.additional_properties)

    rows = pa.concat_tables([pq.read_table(f.file_path.removeprefix("file://")) for f in files])
    with table.transaction() as tx:
        rewrite = _Rewrite(operation=Operation.OVERWRITE, transaction=tx, io=table.io)
        for data_file in files:
            rewrite.delete_data_file(data_file)
        for data_file in _dataframe_to_data_files(table_metadata=tx.table_metadata,
                                                  write_uuid=rewrite.commit_uuid, df=rows,
                                                  io=table.io):
            rewrite.append_data_file(data_file)
        rewrite.commit()
    table = table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot.summary.operation == Operation.REPLACE
    return int(snapshot.snapshot_id)


@pytest.fixture(scope="module")
def iceberg_replaced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Written]:
    """Snapshot s0 (12 rows), 3 appends, a ``replace`` compacting two of them, 3 appends."""
    catalog = sql_catalog(tmp_path_factory.mktemp("iceberg"))
    table = _iceberg_table(catalog)
    written = Written(ICEBERG_ID)
    table = _iceberg_append(table, written, 0, 12)
    for lo in (12, 20, 28):
        table = _iceberg_append(table, written, lo, lo + 8)
    files = [t.file for t in table.scan().plan_files()]
    assert len(files) == 4
    replace = iceberg_rewrite(table, sorted(files, key=lambda f: f.file_path)[:2])
    written.other[replace] = "replace"
    table = table.refresh()
    for lo in (36, 44, 52):
        table = _iceberg_append(table, written, lo, lo + 8)
    return catalog, written


@pytest.mark.parametrize("workers", [0, 2])
def test_iceberg_appends_are_followed_exactly_once_and_a_replace_is_skipped_and_recorded(
        iceberg_replaced: tuple[Any, Written], tmp_path: Path, workers: int) -> None:
    catalog, written = iceberg_replaced
    order = list(written.appended)[:4] + list(written.other) + list(written.appended)[4:]
    first, last = order[0], order[-1]
    replace = next(iter(written.other))
    dataset = LakeDataset(IcebergSource(ICEBERG_ID, catalog=catalog), columns=["id", "x"],
                          batch_size=4, version=first, follow=True, until_version=last,
                          poll_interval=0.02, min_segment_rows=8)
    root = tmp_path / "ckpt"
    batches = _bounded(lambda: _follow_with_checkpoints(dataset, root, every=2,
                                                        workers=workers))
    _assert_exactly_once(flat(batches), [i for s in order if s in written.appended
                                         for i in range(*written.appended[s])])
    segments = [(e["from_version"], e["to_version"], e["rows"])
                for e in ledger_events(root, "segment")]
    appended = [s for s in order[1:] if s in written.appended]
    assert [to for _, to, _ in segments] == appended, "one segment per 8-row append"
    assert [base for base, _, _ in segments] == order[:1] + appended[:-1]
    skipped = ledger_events(root, "skipped_commit")
    assert [e["version"] for e in skipped] == [replace]
    assert "replace" in skipped[0]["reason"]


@pytest.mark.parametrize("change", ["delete", "overwrite"])
def test_an_iceberg_delete_or_overwrite_follows_the_on_change_policy(
        tmp_path: Path, change: str) -> None:
    catalog = sql_catalog(tmp_path / "iceberg")
    table = _iceberg_table(catalog)
    written = Written(ICEBERG_ID)
    table = _iceberg_append(table, written, 0, 10)
    table = _iceberg_append(table, written, 10, 20)
    # a whole file matches: a `delete` snapshot; part of a file: an `overwrite` snapshot
    table.delete("id >= 10" if change == "delete" else "id < 3")
    table = table.refresh()
    changed = table.current_snapshot()
    assert changed.summary.operation.value == change
    table = _iceberg_append(table, written, 20, 30)
    first, *_, last = written.appended

    def follower(on_change: str) -> LakeDataset:
        return LakeDataset(IcebergSource(ICEBERG_ID, catalog=catalog), columns=["id"],
                           batch_size=4, version=first, follow=True, until_version=last,
                           poll_interval=0.02, min_segment_rows=5,
                           on_change=on_change)  # type: ignore[arg-type]

    with pytest.raises(SourceChangedError) as info:
        _bounded(lambda: take(loader_for(follower("fail"), 0)))
    message = str(info.value)
    assert f"version {changed.snapshot_id}" in message and change in message
    assert ICEBERG_ID.split(".")[1] in message
    root = tmp_path / "ckpt"
    batches = _bounded(lambda: _follow_with_checkpoints(follower("skip"), root))
    _assert_exactly_once(flat(batches), written.ids())
    assert [e["version"] for e in ledger_events(root, "skipped_commit")] == [
        changed.snapshot_id]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_follower_of_a_table_created_empty_reads_its_first_appends_and_resumes(
        tmp_path: Path, fmt: str) -> None:
    written = Written(ICEBERG_ID)
    if fmt == "iceberg":
        catalog = sql_catalog(tmp_path / "iceberg")
        table = _iceberg_table(catalog)  # no snapshot yet

        def source() -> Any:
            return IcebergSource(ICEBERG_ID, catalog=catalog)

        def append(lo: int, hi: int) -> None:
            nonlocal table
            table = _iceberg_append(table, written, lo, hi)
    else:
        from deltalake import write_deltalake

        written.uri = str(tmp_path / "table")
        write_deltalake(written.uri, writer.batch(0, 0))  # version 0: no rows

        def source() -> Any:
            return DeltaSource(written.uri)

        def append(lo: int, hi: int) -> None:
            _append(written, lo, hi)

    def follower() -> LakeDataset:
        return LakeDataset(source(), columns=["id"], batch_size=4, follow=True,
                           min_segment_rows=1, max_idle=0.3, poll_interval=0.02)

    dataset = follower()  # pinned before any row was written
    assert dataset.snapshot.rows == 0
    for lo in (0, 10):
        append(lo, lo + 10)
    loader = loader_for(dataset, 0)
    head = take(loader, 3)
    saved = _loader_state(loader)
    append(20, 30)
    resumed = follower()  # pins the latest version, then adopts the state's
    resumed.load_state_dict(saved)
    rest = _bounded(lambda: take(loader_for(resumed, 0)))
    _assert_exactly_once(flat(head + rest), written.ids())


def test_iceberg_appends_committed_while_following_are_delivered_exactly_once(
        tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path / "iceberg")
    table = _iceberg_table(catalog)
    written = Written(ICEBERG_ID)
    table = _iceberg_append(table, written, 0, 10)
    first = table.current_snapshot().snapshot_id
    go = threading.Event()

    def write() -> None:
        own = sql_catalog(tmp_path / "iceberg").load_table(ICEBERG_ID)  # its own connections
        go.wait()
        for lo in range(10, 130, 10):
            own = _iceberg_append(own, written, lo, lo + 10)
            time.sleep(0.03)

    thread = threading.Thread(target=write)
    thread.start()
    dataset = LakeDataset(IcebergSource(ICEBERG_ID, catalog=catalog), columns=["id"],
                          batch_size=4, version=first, follow=True, max_idle=2.0,
                          poll_interval=0.02, min_segment_rows=1)
    go.set()
    delivered = flat(_bounded(lambda: take(loader_for(dataset, 0))))
    thread.join()
    assert len(written.appended) == 13
    _assert_exactly_once(delivered, written.ids())


def test_the_ledger_names_a_carried_tail_where_it_was_left_and_where_it_was_read(
        tmp_path: Path) -> None:
    from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events

    written = _short_segments_table(tmp_path)
    states, datasets = [], []
    for rank in range(2):
        dataset = LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=2,
                              version=0, follow=True, until_version=written.end,
                              min_segment_rows=2, rank=rank, world_size=2)
        loader = loader_for(dataset, 0)
        _bounded(lambda loader=loader: take(loader))
        states.extend(states_from_loader(loader.state_dict()))
        datasets.append(dataset)
    after = merge_states(states)
    v0 = DeltaSource(written.uri).snapshot(0).units[0].path
    events = segment_events(datasets[0], None, after)
    left = [e for name, e in events if name == "undelivered"]
    assert [(e["segment"], e["rows"], e.get("carried"), e["ranges"]) for e in left] == [
        (0, 1, True, [[v0, 0, 0, 1]]),   # the pinned snapshot's lone row: carried on
        (2, 1, True, [[left[1]["ranges"][0][0], 0, 0, 1]])]  # the one the pass ends with
    rounds = [e for name, e in events if name == "round"]
    assert [(e["round"], e["rows"], e["delivered"]) for e in rounds] == [
        (0, 1, 0), (1, 4, 4), (2, 1, 0)]
    records = consumed_between(datasets[0], None, after)
    from_v0 = [(r.segment, r.file, r.row_group, r.row_start, r.row_end, r.rows)
               for r in records if r.file == v0]
    assert from_v0 == [(1, v0, 0, 0, 1, 1)], "read once, in segment 1"
    assert sum(r.rows for r in records) == 4


def test_dataloader_workers_of_two_ranks_carry_the_same_tail_exactly_once(
        tmp_path: Path) -> None:
    # 2 ranks x 2 workers = 4 slices: version 0's lone row is carried into segment 1
    # (versions 1-2: 4 rows, + 1 carried: 5 rows, 1 batch per slice), segment 2 (version 3)
    # gives each slice 1 row; every worker forms the segments and the carry on its own
    written = _short_segments_table(tmp_path)  # versions 0-2: 1, 3, 1 rows
    _append(written, 5, 9)  # version 3: 4 rows
    runs = []
    for rank in range(2):
        dataset = LakeDataset(DeltaSource(written.uri), columns=["id"], batch_size=2,
                              version=0, follow=True, until_version=written.end,
                              min_segment_rows=4, rank=rank, world_size=2)
        runs.append(_bounded(lambda dataset=dataset: take(loader_for(dataset, 2))))
    assert [len(run) for run in runs] == [4, 4], "ranks in lockstep"
    _assert_exactly_once(flat(b for run in runs for b in run), written.ids())
