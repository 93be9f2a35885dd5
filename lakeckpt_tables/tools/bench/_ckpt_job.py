"""One rank of a ``lakeckpt bench checkpoint`` commit job, started by ``torchrun``.

``python -m torch.distributed.run --standalone --nproc-per-node=N -m
lakeckpt_tables.tools.bench._ckpt_job --spec JSON --out PATH``: every rank runs
:func:`~lakeckpt_tables.tools.bench.checkpoint.run_commit_job`; rank 0 writes the result to PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch.distributed as dist

from lakeckpt_tables.tools.bench.checkpoint import CommitJobSpec, run_commit_job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="CommitJobSpec as JSON")
    parser.add_argument("--out", required=True, help="where rank 0 writes the result (JSON)")
    args = parser.parse_args(argv)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    try:
        result = run_commit_job(CommitJobSpec.from_json(args.spec))
        if result is not None:
            tmp = f"{args.out}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, args.out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
