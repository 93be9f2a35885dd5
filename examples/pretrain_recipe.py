"""Pre-train on a mixture whose recipe changes while it runs, and prove from the ledger that
every token was trained once, or recorded as skipped or undelivered, never twice.

    python examples/pretrain_recipe.py             # synthetic tables in a temp dir

Three jobs over packed Delta tables ``web`` and ``code`` (sequences of 64 tokens):

1. weights anneal from 70/30 to 30/70 over steps 40-100 (a ``WeightSchedule`` by step); the job
   is SIGKILLed after step 62, in the middle of the anneal;
2. the same recipe resumes from step 60 and goes on; after step 73 a "loss spike" stops it;
3. a restart from step 70 with a third table ``books`` added (weight 0.2 on top of the
   anneal), skipping the 5 batches after the checkpoint (``CheckpointManager.skip``), to the
   end of the mixture (the first source to run out ends it).

Every token is unique (document id x 64 + position). The proof reads the ledger: for each
committed checkpoint, the rows it trained on and how many tokens of each (``audit.rows``), the
rows skipped before it (``audit.replay.skipped_rows``), the ``undelivered`` tails; so for every
document, tokens trained + skipped + undelivered equal its tokens (+ eos) where its pass ended,
and never exceed them; the ledger's trained tokens equal what the jobs logged; the recipe
changes are events (``mixture_weights``, ``source_added``, ``skipped``); ``verify`` finds no
overlap and no gap. The last line says ``PROOF OK`` or ``PROOF FAILED``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _common import StepLog, read_steps  # examples/_common.py
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset, Mixture
from lakeckpt_tables.audit import connect, verify
from lakeckpt_tables.audit import rows as audit_rows
from lakeckpt_tables.audit.replay import skipped_rows
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.mixture import WeightSchedule

EOS = -1
SEQ_LEN = 64
VOCAB = 256
TABLES = {"web": (0, 1), "code": (100_000, 2), "books": (200_000, 3)}  # first doc, seed
ANNEAL = WeightSchedule.anneal({"web": 0.7, "code": 0.3}, {"web": 0.3, "code": 0.7},
                               first=40, last=100, by="step")
WITH_BOOKS = WeightSchedule.anneal({"web": 0.7, "code": 0.3, "books": 0.2},
                                   {"web": 0.3, "code": 0.7, "books": 0.2},
                                   first=40, last=100, by="step")
JOBS = {1: {"kill_after": 62}, 2: {"kill_after": 73}, 3: {"skip": 5, "books": True}}


def documents(first: int, count: int, seed: int) -> pa.Table:
    """Documents ``first ..`` of 1-63 tokens; token = document id x 64 + position."""
    lengths = np.random.default_rng(seed).integers(1, 64, count)
    docs = [[(first + i) * 64 + k for k in range(int(n))] for i, n in enumerate(lengths)]
    return pa.table({"doc": pa.array(np.arange(first, first + count), pa.int64()),
                     "tokens": pa.array(docs, pa.list_(pa.int64()))})


def make_tables(work: Path, docs: int) -> None:
    from deltalake import WriterProperties, write_deltalake

    for name, (first, seed) in TABLES.items():
        write_deltalake(str(work / name), documents(first, docs, seed),
                        writer_properties=WriterProperties(max_row_group_size=40))


def mixture(work: Path, job: int) -> Mixture:
    def packed(name: str) -> LakeDataset:
        return LakeDataset(DeltaSource(str(work / name)), pack_tokens="tokens", seq_len=SEQ_LEN,
                           eos_id=EOS, batch_size=2, seed=0)

    if JOBS[job].get("books"):  # the restart adds a source (NOTE [ sources that change ])
        return Mixture({n: packed(n) for n in TABLES}, weights=WITH_BOOKS, seed=0)
    return Mixture({n: packed(n) for n in ("web", "code")}, weights=ANNEAL, seed=0)


# ------------------------------------------------------------------------------ one job


def train(work: Path, job: int) -> None:
    """Restore, (skip), train, checkpoint every 5 steps; SIGKILL itself after a step."""
    torch.manual_seed(0)
    loader = StatefulDataLoader(mixture(work, job), batch_size=None)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager = CheckpointManager(work / "ckpt", "recipe")
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    if JOBS[job].get("skip"):
        manager.skip(loader, batches=JOBS[job]["skip"], reason=f"loss spike after step {step}",
                     by="examples/pretrain_recipe.py")
    print(f"resume {step}", flush=True)
    log = StepLog(work / f"job{job}.log")
    names = sorted(TABLES)
    for batch in loader:
        step += 1
        x = (batch["input_ids"] + 1) % VOCAB
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, VOCAB),
                                                 x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        log.write(step, [names.index(batch["source"]), *batch["input_ids"].ravel().tolist()])
        if step % 5 == 0:
            manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
        if step == JOBS[job].get("kill_after"):
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: nothing after this runs
    if step % 5:
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
    log.close()


def run_job(work: Path, job: int) -> tuple[int, int]:
    """Job ``job`` in a process of its own: (exit code, the step it restored)."""
    done = subprocess.run([sys.executable, __file__, "--work", str(work), "--job", str(job)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    resumed = [int(x.split()[1]) for x in done.stdout.splitlines() if x.startswith("resume ")]
    if not resumed:
        print(done.stdout[-2000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"job {job} did not start (exit {done.returncode})")
    return done.returncode, resumed[0]


# ----------------------------------------------------------------------------- the proof


def doc_tokens(work: Path) -> dict[int, int]:
    """Each document's stream elements (tokens + eos), from the tables."""
    out = {}
    for name in TABLES:
        for part in DeltaSource(str(work / name)).snapshot().units:
            table = pq.ParquetFile(part.path).read_row_group(part.row_group, ["doc", "tokens"])
            for doc, tokens in zip(table["doc"].to_pylist(), table["tokens"].to_pylist(),
                                   strict=True):
                out[doc] = len(tokens) + 1
    return out


def per_doc(table: pa.Table) -> Counter[int]:
    """Tokens of each document in an audit table (rows named by file, row group, row)."""
    out: Counter[int] = Counter()
    docs: dict[tuple[str, int], list[int]] = {}
    for file, group, row, n in zip(table["file"].to_pylist(), table["row_group"].to_pylist(),
                                   table["row"].to_pylist(), table["tokens"].to_pylist(),
                                   strict=True):
        if (file, group) not in docs:
            docs[(file, group)] = pq.ParquetFile(file).read_row_group(group, ["doc"])[
                "doc"].to_pylist()
        out[docs[(file, group)][row]] += n
    return out


def run(work: Path, docs: int) -> bool:
    make_tables(work, docs)
    print(f"tables: web, code, books ({docs} documents each); sequences of {SEQ_LEN}; anneal "
          "70/30 -> 30/70 over steps 40-100")
    ok = True
    for job in JOBS:
        code, restored = run_job(work, job)
        print(f"job {job}: restored step {restored}, exit {code}"
              + (" (SIGKILLed)" if code == -signal.SIGKILL else ""))
    # what the jobs logged: job 1 up to step 60, job 2 up to 70, job 3 all
    logged = [(s, ids) for s, ids in read_steps(work / "job1.log") if s <= 60] \
        + [(s, ids) for s, ids in read_steps(work / "job2.log") if s <= 70] \
        + read_steps(work / "job3.log")
    tokens = Counter(t for _, ids in logged for t in ids[1:] if t != EOS)
    twice = sum(1 for n in tokens.values() if n > 1)
    print(f"training logs: {len(logged)} steps, {sum(tokens.values()):,} tokens, {twice} twice")
    ok &= twice == 0
    # the ledger alone: every committed checkpoint's trained rows, the skipped ones, the tails
    ckpt = str(work / "ckpt")
    records = sorted(DeltaLedger(str(work / "ckpt" / "_ledger")).checkpoints("recipe"),
                     key=lambda r: r.step)
    trained: Counter[int] = Counter()
    skipped: Counter[int] = Counter()
    for record in records:
        trained += per_doc(audit_rows(ckpt, checkpoint=record.checkpoint_id))
        skipped += per_doc(skipped_rows(ckpt, checkpoint=record.checkpoint_id))
    con = connect(ckpt)
    events = dict(con.sql("SELECT event, count(*) FROM events WHERE run_id = 'recipe' "
                          "GROUP BY event").fetchall())
    tails = con.sql("SELECT detail->>'source_key', CAST(detail->>'tokens' AS BIGINT) FROM events "
                    "WHERE run_id = 'recipe' AND event = 'undelivered'").fetchall()
    sizes = doc_tokens(work)
    over = [d for d in sizes if trained[d] + skipped[d] > sizes[d]]
    steps_logged = sum(len(ids) - 1 for _, ids in logged)
    same = sum(trained.values()) == steps_logged
    print(f"ledger: {sum(trained.values()):,} tokens trained (the logs: {steps_logged:,}), "
          f"{sum(skipped.values()):,} skipped, {sum(n for _, n in tails):,} undelivered; "
          f"{len(over)} documents over their tokens: {'OK' if same and not over else 'FAILED'}")
    ok &= same and not over and sum(skipped.values()) > 0
    (verdict,) = verify(ckpt)
    print(f"verify up to step {verdict.step}: {verdict.rows} rows trained, {verdict.skipped} "
          f"skipped, passes finished {verdict.finished_passes}, {len(verdict.violations)} "
          f"violations: {'OK' if verdict.ok else verdict.violations[:3]}")
    ok &= verdict.ok and verdict.skipped > 0
    ended = []
    for name, (first, _) in TABLES.items():
        left = sum(sizes[d] - trained[d] - skipped[d] for d in range(first, first + docs))
        tail = sum(n for key, n in tails if key == name)
        if left == tail:  # the first source to run out ends the mixture ("stop")
            ended.append(name)
            print(f"{name}: its pass ended, every token trained, skipped or in its undelivered "
                  f"tail ({tail} tokens): OK")
        else:
            print(f"{name}: its pass had not ended when the mixture stopped: "
                  f"{left - tail:,} tokens not read yet, none twice")
    ok &= len(ended) == 1
    wanted = {"mixture_weights", "source_added", "skipped"}
    print(f"recipe events: { {e: events.get(e, 0) for e in sorted(wanted)} }: "
          f"{'OK' if all(events.get(e) == 1 for e in wanted) else 'FAILED'}")
    ok &= all(events.get(e) == 1 for e in wanted)
    print("PROOF OK" if ok else "PROOF FAILED")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--docs", type=int, default=300, help="documents per table")
    p.add_argument("--work", help="keep the tables, checkpoints and logs here")
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    if args.job is not None:
        train(Path(args.work), args.job)
        return 0
    if args.work is not None:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        return 0 if run(Path(args.work), args.docs) else 1
    with tempfile.TemporaryDirectory(prefix="lakeckpt-recipe-") as work:
        return 0 if run(Path(work), args.docs) else 1


if __name__ == "__main__":
    sys.exit(main())
