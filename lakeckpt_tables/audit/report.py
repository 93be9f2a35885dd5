"""One self-contained HTML page an auditor can forward: plot, runs, checkpoints, events.

No network and no script: the plot is an inline PNG (a data: URI), the style is inline CSS,
every value is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from datetime import UTC, datetime
from typing import Any

from lakeckpt_tables.audit.plot import progress_png

__all__ = ["render_report"]

_SECTIONS = (
    # a branched run right under the run it came from (NOTE [ branched runs ]), one level deep
    ("Runs", "SELECT CASE WHEN r.parent_run IS NULL THEN r.run_id ELSE '└ ' || r.run_id END "
             "AS run_id, r.parent_run || ' @ step ' || r.parent_step AS branched_from, "
             "r.state, r.checkpoints, r.last_step, c.world_size, "
             "r.source_location AS source_table, c.rows_consumed, "
             "r.last_commit_at AS last_commit, round(r.save_interval_s, 1) AS save_interval_s "
             "FROM runs r LEFT JOIN (SELECT run_id, max(world_size) AS world_size, "
             "CAST(sum(rows) FILTER (WHERE status = 'committed') AS BIGINT) AS rows_consumed "
             "FROM checkpoints GROUP BY run_id) c USING (run_id) "
             "ORDER BY coalesce(r.parent_run, r.run_id), r.parent_run NULLS FIRST, r.run_id"),
    ("Progress", "SELECT run_id, segment, epoch, state, rows_consumed, rows_in_pass, percent, "
                 "round(rows_per_s, 1) AS rows_per_s, round(eta_s, 1) AS eta_s, last_step "
                 "FROM progress"),
    ("Checkpoints", "SELECT run_id, step, checkpoint_id, CASE WHEN status = 'committed' AND "
                    "removed_reason IS NOT NULL THEN 'removed' ELSE status END AS status, "
                    "tags, world_size, source_version, rows, committed_at FROM checkpoints"),
    ("Recoveries", "SELECT run_id, restored_at, checkpoint_id, step, newest_step, reached_step, "
                   "steps_lost, fallback FROM recoveries"),
    ("Events", "SELECT run_id, step, committed_at, event, segment, epoch, rows, detail "
               "FROM events"),
)

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 2em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eee; }
td.detail { max-width: 40em; overflow-wrap: anywhere; font-family: monospace; }
p.empty { color: #777; }
"""


def render_report(con: Any, *, title: str) -> str:
    """The report page of connection ``con`` (see :func:`~lakeckpt_tables.audit.connect`)."""
    png = base64.b64encode(progress_png(con)).decode()
    ledgers = con.sql("SELECT ledger, version, rows FROM ledgers").fetchall()  # no timestamps
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>Ledger "
        + ", ".join(f"{html.escape(str(w))} at version {v} ({n} rows)" for w, v, n in ledgers)
        + f"; generated {datetime.now(UTC).isoformat(timespec='seconds')}.</p>",
        '<h2 id="plot">Rows consumed over time</h2>',
        f'<img id="progress-plot" alt="rows consumed over time per run" '
        f'src="data:image/png;base64,{png}">',
    ]
    for name, sql in _SECTIONS:
        # through Arrow: DuckDB's own fetchall needs pytz for time zone aware timestamps
        result = con.sql(sql).to_arrow_table()
        columns, rows = result.column_names, [tuple(r.values()) for r in result.to_pylist()]
        parts.append(f'<h2 id="{name.lower()}">{name}</h2>')
        if not rows:
            parts.append(f'<p class="empty">No {name.lower()}.</p>')
            continue
        parts.append(f'<table id="{name.lower()}-table"><thead><tr>'
                     + "".join(f"<th>{html.escape(c)}</th>" for c in columns)
                     + "</tr></thead><tbody>")
        for row in rows:
            cells = []
            for c, v in zip(columns, row, strict=True):
                css = ' class="detail"' if c == "detail" else ""
                cells.append(f"<td{css}>{html.escape(_text(v))}</td>")
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)
