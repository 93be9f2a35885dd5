"""Rows consumed over time per run, restores and fallbacks marked: a PNG (matplotlib, Agg)."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["plot_progress", "progress_png"]


def progress_png(con: Any, *, run: str | None = None) -> bytes:
    """The progress plot of connection ``con`` (see :func:`~lakeckpt_tables.audit.connect`).

    One line per run: cumulative rows consumed by its committed checkpoints against commit
    time; a triangle at every restore (red when it fell back, losing steps), a cross at every
    retired checkpoint.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display; also the only backend safe in a headless job
    import matplotlib.pyplot as plt

    where = "" if run is None else "AND run_id = $run"
    params = {} if run is None else {"run": run}
    points = con.sql(
        "SELECT run_id, committed_at, CAST(sum(rows) OVER (PARTITION BY run_id ORDER BY step) "
        f"AS BIGINT) AS total FROM checkpoints WHERE status = 'committed' {where} "
        "ORDER BY run_id, step", params=params or None)
    points = _tuples(points)
    restores = _tuples(con.sql("SELECT run_id, restored_at, fallback FROM recoveries "
                               f"WHERE TRUE {where}", params=params or None))
    retired = _tuples(con.sql("SELECT run_id, committed_at, rows FROM checkpoints "
                              f"WHERE status <> 'committed' {where}", params=params or None))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        runs = sorted({p[0] for p in points})
        for name in runs:
            xs = [p[1] for p in points if p[0] == name]
            ys = [p[2] for p in points if p[0] == name]
            (line,) = ax.plot(xs, ys, marker=".", label=name)
            for _, at, fallback in (r for r in restores if r[0] == name):
                ax.axvline(at, color="red" if fallback else line.get_color(), linestyle=":",
                           linewidth=1)
                ax.plot([at], [0], marker="^", color="red" if fallback else line.get_color())
        for _, at, _rows in retired:
            ax.plot([at], [0], marker="x", color="black")
        ax.set_title("rows consumed (committed checkpoints)")
        ax.set_xlabel("commit time (UTC)")
        ax.set_ylabel("rows")
        if runs:
            ax.legend(loc="upper left", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no checkpoint has consumed rows yet", ha="center",
                    transform=ax.transAxes)
        fig.autofmt_xdate()
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def _tuples(relation: Any) -> list[tuple[Any, ...]]:
    # through Arrow: DuckDB's own fetchall needs pytz for time zone aware timestamps
    return [tuple(r.values()) for r in relation.to_arrow_table().to_pylist()]


def plot_progress(con: Any, path: str, *, run: str | None = None) -> None:
    """Write :func:`progress_png` to ``path``."""
    with open(path, "wb") as f:
        f.write(progress_png(con, run=run))
