"""Pre-train a tiny language model on a 70/30 mixture of a Delta and an Iceberg token table,
packed into sequences of 128 tokens, under torchrun with 2 ranks; SIGKILL it, resume it, and
prove that every document's tokens were trained exactly once, in order.

    python examples/pretrain_mixture.py            # synthetic tables in a temp dir

The run is two torchrun jobs: the first is SIGKILLed (every rank, a real crash) a few steps
after a checkpoint; the second restores the newest checkpoint and trains to the end of the
mixture (``on_exhausted="stop"``: the first source to run out ends it). Every token is unique
(document id x 64 + position), so the proof needs nothing from the library: the tokens each
rank trained (the killed job's steps up to the restored checkpoint, then the second job's)
equal, batch for batch, those of the same mixture read without a crash, and
``check_exactly_once`` finds no token twice and none missing; each document's tokens come in
order. The ledger's consumption records, per source key, count each row once and as many rows
as documents were finished (eos trained), and ``lakeckpt_tables.audit.verify`` (``lakeckpt
verify``) finds no overlap in any source. The last line says ``PROOF OK`` or ``PROOF FAILED``.
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
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from _common import StepLog, read_steps, sql_catalog  # examples/_common.py
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset, Mixture
from lakeckpt_tables.audit import verify
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

EOS = -1
SEQ_LEN = 128
VOCAB = 512
WEIGHTS = {"web": 0.7, "code": 0.3}
ICEBERG_ID = "corpus.code"


# ----------------------------------------------------------------------------- tables


def documents(first: int, count: int, seed: int) -> pa.Table:
    """Documents ``first ..`` of 1-63 tokens; token = document id x 64 + position."""
    lengths = np.random.default_rng([seed, first]).integers(1, 64, count)
    docs = [[(first + i) * 64 + k for k in range(int(n))] for i, n in enumerate(lengths)]
    return pa.table({"doc": pa.array(np.arange(first, first + count), pa.int64()),
                     "tokens": pa.array(docs, pa.list_(pa.int64()))})


def make_tables(work: Path, docs: int) -> None:
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=50)
    for lo in range(0, docs, docs // 2):
        write_deltalake(str(work / "web"), documents(lo, docs // 2, 1), mode="append",
                        writer_properties=props)
    catalog = sql_catalog(None, work / "iceberg")
    catalog.create_namespace_if_not_exists("corpus")
    table = catalog.create_table(ICEBERG_ID, schema=documents(0, 1, 2).schema,
                                 properties={"write.parquet.row-group-limit": "50"})
    table.append(documents(100_000, docs // 2, 2))


def mixture(work: Path, *, rank: int, world_size: int, batch_size: int) -> Mixture:
    catalog = sql_catalog(None, work / "iceberg")
    common = dict(pack_tokens="tokens", seq_len=SEQ_LEN, eos_id=EOS, batch_size=batch_size,
                  seed=0, rank=rank, world_size=world_size)
    return Mixture({"web": LakeDataset(DeltaSource(str(work / "web")), **common),
                    "code": LakeDataset(IcebergSource(ICEBERG_ID, catalog=catalog), **common)},
                   weights=WEIGHTS, seed=0, on_exhausted="stop")


# ---------------------------------------------------------------------- one torchrun rank


def train(args: argparse.Namespace) -> None:
    """One rank: restore, train, checkpoint every N steps; SIGKILL itself after a step."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    work = Path(args.work)
    loader = StatefulDataLoader(mixture(work, rank=rank, world_size=world,
                                        batch_size=args.batch_size), batch_size=None)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager = CheckpointManager(work / "ckpt", "pretrain", keep_last=2)
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    if rank == 0:
        print(f"resume {step}", flush=True)
    log = StepLog(work / f"rank{rank}.job{args.job}.log")
    for batch in loader:
        step += 1
        ids = batch["input_ids"]
        x = (ids + 1) % VOCAB  # eos (-1) is token 0
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        for p in model.parameters():  # data parallel by hand: average the gradients
            dist.all_reduce(p.grad)  # type: ignore[arg-type]
            p.grad /= world  # type: ignore[operator]
        optimizer.step()
        log.write(step, [0 if batch["source"] == "web" else 1, *ids.ravel().tolist()])
        if step % args.checkpoint_every == 0:
            manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
        if step == args.kill_after_step:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: nothing after this runs
    if step % args.checkpoint_every:  # the last steps too (a step is saved once: a second
        # save of it, with the loader now at its end, would be refused as a conflict)
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
    log.close()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ the proof


def torchrun(args: argparse.Namespace, job: int, kill_after: int) -> tuple[int, int]:
    """A 2-rank torchrun job; (exit code, step it restored)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", __file__, "--rank-job", "--work", args.work, "--job", str(job),
           "--batch-size", str(args.batch_size), "--checkpoint-every",
           str(args.checkpoint_every), "--kill-after-step", str(kill_after)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    resumed = [int(line.split()[1]) for line in done.stdout.splitlines()
               if line.startswith("resume ")]
    if not resumed:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"job {job} did not start (exit {done.returncode})")
    if kill_after < 0 and done.returncode:  # a job that should have ended well: say why not
        print(done.stderr[-3000:])
    return done.returncode, resumed[0]


def trained(work: Path, rank: int, restored: int) -> list[list[int]]:
    """The steps rank ``rank`` trained for good: job 1's up to the restored step, then job 2's
    (each step: source flag, then its tokens)."""
    first = [ids for step, ids in read_steps(work / f"rank{rank}.job1.log") if step <= restored]
    return first + [ids for _, ids in read_steps(work / f"rank{rank}.job2.log")]


def run(args: argparse.Namespace) -> bool:
    work = Path(args.work)
    make_tables(work, args.docs)
    print(f"tables: Delta {work / 'web'} and Iceberg {ICEBERG_ID}, {args.docs // 2} documents "
          f"each; mixture {WEIGHTS}, sequences of {SEQ_LEN} tokens, 2 ranks")
    code, _ = torchrun(args, 1, args.kill_after_step)
    print(f"job 1: SIGKILLed after step {args.kill_after_step} (exit {code})")
    code, restored = torchrun(args, 2, -1)
    print(f"job 2: restored step {restored}, trained to the end (exit {code})")
    ok = code == 0
    delivered: list[int] = []
    expected: list[int] = []
    eos = Counter[str]()
    for rank in range(2):
        got = trained(work, rank, restored)
        reference = [[0 if b["source"] == "web" else 1, *b["input_ids"].ravel().tolist()]
                     for b in mixture(work, rank=rank, world_size=2,
                                      batch_size=args.batch_size)]
        same = got == reference
        ok &= same
        print(f"rank {rank}: {len(got)} steps trained, the uninterrupted run's "
              f"{len(reference)}: {'same batches, same order' if same else 'DIFFERENT'}")
        stream = [t for step in got for t in step[1:]]
        delivered += [t for t in stream if t != EOS]
        expected += [t for step in reference for t in step[1:] if t != EOS]
        for step in got:
            eos["web" if step[0] == 0 else "code"] += step[1:].count(EOS)
        positions: dict[int, int] = {}
        for t in stream:  # each document's tokens in order (a rank may start mid-document)
            if t != EOS:
                if t // 64 in positions and positions[t // 64] + 1 != t % 64:
                    ok = False
                positions[t // 64] = t % 64
    verdict = check_exactly_once(delivered, expected)
    print(f"tokens: {len(delivered):,} trained, {len(verdict.duplicated)} twice, "
          f"{len(verdict.missing)} missing: {'OK' if verdict else 'FAILED'}")
    ok &= bool(verdict)
    rows = Counter[tuple[Any, ...]]()
    for rec in DeltaLedger(str(work / "ckpt" / "_ledger")).consumption(
            run_id="pretrain").to_pylist():
        for row in range(rec["row_start"], rec["row_end"]):
            rows[(rec["source_key"], rec["file"], rec["row_group"], row)] += 1
    for key in WEIGHTS:
        counted = sum(n for k, n in rows.items() if k[0] == key)
        twice = sum(1 for k, n in rows.items() if k[0] == key and n > 1)
        good = counted == eos[key] and twice == 0
        ok &= good
        print(f"ledger {key}: {counted} documents consumed, {eos[key]} finished in training, "
              f"{twice} twice: {'OK' if good else 'FAILED'}")
    (verdict,) = verify(str(work / "ckpt"), source_catalog=sql_catalog(None, work / "iceberg"))
    print(f"verify run pretrain up to step {verdict.step}: {verdict.records} records of "
          f"{verdict.rows} rows, {len(verdict.violations)} violations: "
          f"{'OK' if verdict.ok else verdict.violations[:3]}")
    ok &= verdict.ok
    print("PROOF OK" if ok else "PROOF FAILED")
    return ok


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--docs", type=int, default=600, help="documents (half per table)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--kill-after-step", type=int, default=12)
    p.add_argument("--work", help="keep the tables, checkpoints and logs here")
    p.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    if args.rank_job:
        train(args)
        return 0
    if args.work is not None:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        return 0 if run(args) else 1
    with tempfile.TemporaryDirectory(prefix="lakeckpt-pretrain-") as work:
        args.work = work
        return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
