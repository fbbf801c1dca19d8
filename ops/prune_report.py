"""What a prune run did (or, dry, would do): by table, and as the figures `keylane status`
and `/metrics` show of the last one (:mod:`.retention` runs the prune)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..workers.store_rows import TableAge

#: The tables the prune archives from.
TABLES = ("journal", "deliveries", "dead_letters", "lease_log")


@dataclass
class TableReport:
    """What the prune did to one table (a dry run: what it would do)."""

    due: int = 0  # rows past their retention when the run looked
    archived: int = 0  # rows now in the archive alone
    kept: int = 0  # rows that changed while being archived: they stay in the table
    files: int = 0
    retention_s: dict[str, int] = field(default_factory=dict)  # by source, or "" for all


@dataclass
class PruneReport:
    """One prune run."""

    started_at: float
    dry_run: bool
    tables: dict[str, TableReport] = field(
        default_factory=lambda: {t: TableReport() for t in TABLES}
    )
    finished_at: float = 0.0
    recovered_files: int = 0  # pending files an interrupted run left, settled first
    removed_temporaries: int = 0
    forgotten_ids: int = 0
    batches: int = 0  # delete transactions
    longest_batch_s: float = 0.0  # the longest of them: the most a lane waited on it
    busy_retries: int = 0  # batches tried again: the store stayed busy with the lanes
    reclaimed: list[str] = field(default_factory=list)  # tables vacuumed (PostgreSQL)
    reclaim_s: float = 0.0
    skipped: str | None = None
    warnings: list[str] = field(default_factory=list)
    sizes: dict[str, TableAge] = field(default_factory=dict)
    batch_s: list[float] = field(default_factory=list, repr=False)  # each one's hold

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        out = asdict(self)
        del out["batch_s"]
        out["seconds"] = round(self.finished_at - self.started_at, 3)
        held = sorted(self.batch_s)
        out["batch_p50_s"] = held[len(held) // 2] if held else 0.0
        out["batch_p99_s"] = held[int(len(held) * 0.99)] if held else 0.0
        return out


def report_figures(report: PruneReport) -> tuple[dict[str, float], dict[str, int], list[str]]:
    """What the status and the metrics show: sizes and the last prune (and the fields of
    tables now empty, which have no oldest row), and running totals."""
    figures: dict[str, float] = {
        "last_prune_at": report.finished_at,
        "last_prune_seconds": report.finished_at - report.started_at,
        "last_prune_longest_batch_seconds": report.longest_batch_s,
    }
    empty: list[str] = []
    for table, age in report.sizes.items():
        figures[f"{table}_rows"] = age.rows
        if age.oldest is None:
            empty.append(f"{table}_oldest")
        else:
            figures[f"{table}_oldest"] = age.oldest
    totals = {f"archived_{t}": r.archived for t, r in report.tables.items()}
    totals["forgotten_ids"] = report.forgotten_ids
    return figures, totals, empty
