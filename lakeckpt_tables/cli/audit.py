"""``lakeckpt audit TARGET``: which rows trained a checkpoint, who read a file, who saw a row."""

from __future__ import annotations

import argparse

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser, sources=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", metavar="ID",
                      help="the exact (file, row group, row) this checkpoint trained on since "
                      "its parent")
    what.add_argument("--file", metavar="PATH", help="which checkpoints of which runs (and "
                      "Mixture sources) read this data file, rows and tokens")
    what.add_argument("--where", metavar="PRED", help="which checkpoints of which runs "
                      "trained on rows matching this SQL predicate (a packed reader's: any "
                      "token of them), evaluated over each run's own source tables")
    parser.add_argument("--table", metavar="URI",
                        help="with --where: only runs that read this table (Delta URI or "
                        "iceberg:<namespace.table>)")
    parser.add_argument("--rows", action="store_true",
                        help="with --where: one line per matching row and run: the checkpoints "
                        "that trained on it, the table version that deleted it, and the "
                        "checkpoint after which none trained on it")
    parser.add_argument("--cumulative", action="store_true",
                        help="with --checkpoint: also the rows of its ancestors (through the "
                        "runs it was branched from)")
    parser.add_argument("--tokenizer", metavar="JSON", default=None,
                        help="with --checkpoint: the tokenizer.json of a run that packed a text "
                        "column (its documents' tokens say which rows each sequence held)")
    parser.add_argument("--skipped", action="store_true",
                        help="with --checkpoint: the rows skipped (consumed, not trained on) "
                        "before it instead of those it trained on")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    if args.checkpoint is not None:
        return _checkpoint(args)
    if args.file is not None:
        return _file(args)
    return _where(args)


def _checkpoint(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.replay import rows, skipped_rows
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    options = {"catalog": args.catalog, "storage_options": storage_options(args),
               "source_catalog": source_catalog(args)}
    if args.tokenizer is not None:
        from tokenizers import Tokenizer

        options["tokenizer"] = Tokenizer.from_file(args.tokenizer)
    if args.skipped:
        table = skipped_rows(args.target, checkpoint=args.checkpoint, **options)
    else:
        table = rows(args.target, checkpoint=args.checkpoint, cumulative=args.cumulative,
                     **options)
    if args.output != "table":
        emit(table, args.output)
        return 0
    import duckdb

    con = duckdb.connect()
    con.register("r", table)
    keyed = "source_key, " if table["source_key"].null_count < table.num_rows else ""
    tokens = ", CAST(sum(tokens) AS BIGINT) AS tokens" \
        if table["tokens"].null_count < table.num_rows else ""  # packed: tokens delivered
    summary = con.sql(
        f"SELECT {keyed}rank, worker, segment, epoch, file, row_group, count(*) AS rows, "
        f"min(row) AS first_row, max(row) AS last_row{tokens} FROM r GROUP BY ALL ORDER BY ALL")
    what = "rows skipped before" if args.skipped else "rows of"
    emit(summary.to_arrow_table(), "table", title=f"{what} checkpoint {args.checkpoint} "
         "(per row group; --output csv for every row)", empty="no rows")
    _skips(args, options)
    return 0


def _skips(args: argparse.Namespace, options: dict[str, object]) -> None:
    """Batches skipped before the checkpoint: consumed, not trained on (NOTE [ skipped
    batches ] in ``checkpoint/skip.py``)."""
    from lakeckpt_tables.audit.skipped import skip_events, skipped_table
    from lakeckpt_tables.audit.sources import ledger_options
    from lakeckpt_tables.audit.target import read_ledger

    snapshot = read_ledger(args.target, catalog=options["catalog"], storage_options=ledger_options(
        args.target, options["storage_options"]))  # type: ignore[arg-type]
    found = [d for key, details in skip_events(snapshot).items()
             if key.startswith(args.checkpoint) for d in details]
    if found:
        emit(skipped_table(found), "table", title="skipped before it: consumed, NOT trained on "
             "(--skipped for their rows)")


def _file(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    con = connect(args.target, catalog=args.catalog, storage_options=storage_options(args),
                  source_catalog=source_catalog(args))
    result = con.sql(
        "SELECT run_id, step, checkpoint_id, status, source_key, "
        "list(DISTINCT row_group ORDER BY row_group) AS row_groups, "
        "CAST(sum(rows) AS BIGINT) AS rows, CAST(sum(tokens) AS BIGINT) AS tokens "
        "FROM consumption WHERE file = $file OR file LIKE '%/' || $name GROUP BY ALL "
        "ORDER BY run_id, step, source_key",
        params={"file": args.file, "name": args.file.lstrip("/")})
    emit(result.to_arrow_table(), args.output, title=f"checkpoints that read {args.file}",
         empty="no checkpoint read it")
    return 0


def _where(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.where import exposure, matches_of, row_exposure
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    options = storage_options(args)
    per_row = row_exposure(args.target, args.where, args.table, catalog=args.catalog,
                           storage_options=options, source_catalog=source_catalog(args))
    if args.rows:
        emit(per_row, args.output, title=f"rows where {args.where}, per run",
             empty="no checkpoint trained on a matching row")
        return 0
    runs = exposure(args.target, matches_of(per_row), catalog=args.catalog,
                    storage_options=options, per_row=per_row)
    if args.output == "json":
        emit([r.to_json() for r in runs], "json")
        return 0
    rows = [{**r.to_json(), "checkpoints": len(r.checkpoints), "exposed": len(r.exposed),
             "inherited_from": ", ".join(r.inherited_from)} for r in runs]
    emit(rows, args.output, columns=("run_id", "first_step", "last_step", "first_checkpoint",
                                     "last_checkpoint", "rows", "checkpoints", "exposed",
                                     "inherited_from", "deleted", "stopped_after_step"),
         title=f"runs that trained on rows where {args.where}",
         empty="no checkpoint trained on a matching row")
    return 0
