"""Upkeep of a Delta ledger: compaction, log checkpoints, orphan files."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, CommitProperties

from lakeckpt_tables.errors import CommitStateUnknownError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.compaction import ORDER, Slice, fragmented, sorted_files
from lakeckpt_tables.ledger.delta_files import DeltaFiles
from lakeckpt_tables.ledger.summary import SUMMARY_DIR, summarize, summary_path, write_summary

__all__ = ["COMPACTION_PROPERTY", "ORPHAN_GRACE_HOURS", "REPLACED_GRACE_HOURS", "DeltaUpkeep"]

log = logging.getLogger("lakeckpt_tables.ledger.delta")

ORPHAN_GRACE_HOURS = 24
"""Files younger than this are never orphans: a commit may be writing them."""

REPLACED_GRACE_HOURS = 168
"""Files a compaction replaced are kept this long (Delta's default retention): a reader of an
older ledger version, an audit in flight, may still read them."""


COMPACTION_PROPERTY = "lakeckpt.compaction"
"""Commit metadata key marking the rewrite made by :meth:`DeltaLedger.compact`."""


class DeltaUpkeep(DeltaFiles):
    """Maintenance of a :class:`~lakeckpt_tables.ledger.DeltaLedger` (a mixin)."""

    def _refresh(self) -> None:
        raise NotImplementedError

    def _read_where(self, where: pc.Expression | None,
                    columns: list[str] | None = None) -> pa.Table:
        raise NotImplementedError

    def _write_file(self, rows: pa.Table, *, data_change: bool = True) -> AddAction:
        raise NotImplementedError

    def _discard(self, prepared: list[AddAction]) -> None:
        raise NotImplementedError

    def _log_call(self, action: str, call: Any) -> Any:
        raise NotImplementedError

    def compact(self) -> None:
        """Rewrite the ledger's files into few large ones and checkpoint the log.

        NOTE [ delta ledger compaction ]
        delta-rs's OPTIMIZE lets two concurrent compactions that remove the same files both
        land (each adds its own rewritten copy: every row twice), and it ignores app
        transactions. So the rewrite is an overwrite of exactly the snapshot read, which
        delta-rs's conflict checker refuses if anything was committed since: of two
        concurrent compactions the second gives way, and a compaction racing a ledger commit
        either gives way or makes that commit lose its race and settle again. No row is ever
        lost or doubled. The replaced files stay on disk until a VACUUM.

        The rewrite holds a bounded number of rows in memory, whatever the size of the
        ledger (:mod:`lakeckpt_tables.ledger.compaction`); a ledger already compacted is left
        alone.

        Raises:
            LedgerCorruptError: a ledger file cannot be read (nothing was changed).
            CommitStateUnknownError: the rewrite may or may not have landed.
        """
        with self._lock:
            self._refresh()
            if self._fragmented():
                self._rewrite()
            self._log_call("checkpoint", self._table.create_checkpoint)

    def _fragmented(self) -> bool:
        actions = pa.table(self._table.get_add_actions(flatten=True))
        return fragmented(actions["num_records"].to_pylist()
                          if "num_records" in actions.column_names else [None] * len(actions))

    def _rewrite(self) -> None:
        prepared: list[AddAction] = []
        try:
            keys = self._read_where(None, list(ORDER))
            for rows in sorted_files(keys, lambda cut: self._read_where(_where(cut))):
                prepared.append(self._write_file(rows, data_change=False))
                self._summarize(prepared[-1], rows)
        except BaseException:
            self._drop(prepared)
            raise
        properties = CommitProperties(custom_metadata={COMPACTION_PROPERTY: "true"})
        try:
            self._table.create_write_transaction(
                prepared, mode="overwrite", schema=s.LEDGER_SCHEMA,
                commit_properties=properties)
        except CommitFailedError:
            self._drop(prepared)
            log.info("ledger %s: a concurrent commit won over compaction; giving way",
                     self.describe())
            return
        except (DeltaError, OSError) as e:
            raise CommitStateUnknownError(
                f"ledger {self.describe()}: the compaction may or may not have landed "
                f"({e}); its rows are the same either way, compact again later") from e
        self._refresh()

    def _drop(self, prepared: list[AddAction]) -> None:
        """Delete the files and summaries of a rewrite that did not land."""
        self._discard(prepared)
        for action in prepared:
            with contextlib.suppress(OSError):
                self._fs.delete_file(summary_path(self._base, action.path))

    def _summarize(self, prepared: AddAction, rows: pa.Table) -> None:
        """Write the consumption summary of a compacted file (NOTE [ consumption summaries ])."""
        try:
            write_summary(self._fs, self._base, prepared.path, prepared.size, summarize(rows))
        except OSError as e:  # derived data: readers sum the file's rows without it
            log.warning("ledger %s: no consumption summary for %s (%s)", self.describe(),
                        prepared.path, e)

    def remove_orphans(self, *, older_than_hours: int = ORPHAN_GRACE_HOURS,
                       dry_run: bool = False) -> list[str]:
        """Remove the ledger's orphan files: data files no log entry names (written by a
        commit that crashed or lost its race and could not clean up), and summaries of files
        no longer live. Nothing else: live files, and files a compaction replaced that the log
        still names (:meth:`remove_replaced` decides about those), are kept.

        A file younger than ``older_than_hours`` is kept whatever it is: a commit may be
        writing it right now (a commit attempt takes seconds; a day is far beyond any).

        Args:
            older_than_hours: the grace period.
            dry_run: list, remove nothing.

        Returns:
            The removed files, relative to the table.
        """
        with self._lock:
            self._refresh()
            unnamed = set(self._vacuumable(older_than_hours, full=True))
            # the files the log names as removed (a compaction's replaced files) are
            # remove_replaced's business: only files never committed are orphans
            tombstones = set(self._vacuumable(0))
            live = {self._relative(path).rsplit("/", 1)[-1] for path, _ in self.loaded_files()[1]}
        orphans = sorted(unnamed - tombstones)
        orphans += self._stale_summaries(live, older_than_hours)
        return self._delete(orphans, dry_run)

    def remove_replaced(self, *, older_than_hours: int = REPLACED_GRACE_HOURS,
                        dry_run: bool = False) -> list[str]:
        """Remove the data files compactions replaced more than ``older_than_hours`` ago, so
        that a ledger that lives for months keeps one copy of its rows on disk, not one more
        per compaction. The log still names them as removed (as after Delta's VACUUM, without
        its commits); their summaries become stale, which :meth:`remove_orphans` removes.

        Returns:
            The removed files, relative to the table.
        """
        with self._lock:
            self._refresh()
            replaced = sorted(self._vacuumable(older_than_hours))
        return self._delete(replaced, dry_run)

    def _vacuumable(self, older_than_hours: int, *, full: bool = False) -> list[str]:
        """What Delta's VACUUM would delete (listed only: its own deletes commit to the log):
        files the log removed longer ago than the retention, and with ``full`` files it never
        named."""
        return list(self._table.vacuum(retention_hours=older_than_hours, dry_run=True,
                                       enforce_retention_duration=False, full=full))

    def _delete(self, paths: list[str], dry_run: bool) -> list[str]:
        """Delete ``paths`` (relative to the table) unless ``dry_run``; gone already is fine."""
        for path in paths if not dry_run else ():
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(self._data_path(path))
        return paths

    def _stale_summaries(self, live: set[str], older_than_hours: int) -> list[str]:
        where = self._data_path(SUMMARY_DIR)
        selector = pa_fs.FileSelector(where, allow_not_found=True)
        cutoff = time.time() - older_than_hours * 3600
        return sorted(f"{SUMMARY_DIR}/{info.base_name}"
                      for info in self._fs.get_file_info(selector)
                      if info.base_name not in live and info.mtime is not None
                      and info.mtime.timestamp() <= cutoff)



def _where(cut: Slice) -> pc.Expression:
    record, run_id, first, last = cut
    return ((pc.field(s.RECORD) == record) & (pc.field(s.RUN_ID) == run_id)
            & (pc.field(s.STEP) >= first) & (pc.field(s.STEP) <= last))
