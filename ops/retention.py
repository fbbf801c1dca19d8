"""The prune: the store keeps what it needs and archives the rest.

What leaves, and when (see the docs page "Retention and the archive",
ops/docs/retention.md):

* **journal rows**, once older than their source's journal retention (at least its
  dedupe retention plus ``KEYLANE_JOURNAL_MARGIN_S``); a dead-lettered event's row stays
  while its review row is open or was closed within that time, so a retry finds it. Each
  archived row leaves its id's 64-bit hash in ``archived_ids``, so a replay of it is
  still refused, for ``KEYLANE_ARCHIVED_ID_RETENTION_S`` after the event;
* **closed dead-letter rows**, ``KEYLANE_DEAD_LETTER_RETENTION_S`` after they were closed;
* **lease-log entries** (what ``keylane audit`` reads), after
  ``KEYLANE_LEASE_LOG_RETENTION_S``.

Each goes to a complete archive file first (:mod:`.archive`), then leaves its table in
delete transactions of ``KEYLANE_PRUNE_BATCH_ROWS`` rows, each followed by a pause at
least as long as it took (and ``KEYLANE_PRUNE_PAUSE_MS``), so a lane never waits on the
prune for more than one batch, and the prune holds the store half the time at most.
One prune runs per store at a time (:meth:`RetentionStore.maintenance_lock`; another is
skipped, not queued), and a run settles whatever an interrupted one left before it starts,
so running it again, from any process, at any time, is always safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..routing.contract.errors import BrokerUnavailable, ConfigError, StoreUnavailable
from ..routing.contract.faults import Faults
from ..routing.contract.settings import Settings
from ..workers.faults import crash
from ..workers.store import JournalStore, RetentionStore
from ..workers.store_rows import ArchiveRow, PrunedTable, Removal, TableAge
from ..workers.stores import open_existing_store, open_store
from .archive import Archive, day_of, read_rows
from .deployment_view import RetentionRecords
from .prune_report import PruneReport, report_figures

if TYPE_CHECKING:
    from ..routing.contract.sources import Sources

log = logging.getLogger("keylane.retention")

#: Rows read for one archive file at most (read outside any write transaction).
FILE_ROWS = 50_000
#: Tries of one delete transaction while the store stays busy with the lanes.
BUSY_RETRIES = 20
#: The prune's statement and lock timeout: it may wait (a first run counts a large backlog,
#: and on SQLite it waits for the lanes to leave it the write lock); the lanes keep theirs.
PRUNE_TIMEOUT_MS = 120_000
_PRUNED: dict[str, PrunedTable] = {
    "journal": "journal",
    "dead_letters": "dead_letters",
    "deliveries": "deliveries",
}
#: The time a row's archive folder (its day) is taken from.
_TIME_FIELD = {
    "journal": "recorded_at",
    "dead_letters": "created_at",
    "lease_log": "written_at",
    "deliveries": "received_at",
}

#: Called as the prune goes: (table, rows done, rows due).
Progress = Callable[[str, int, int], None]


def run_prune(
    settings: Settings,
    now: float | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    existing_store: bool = False,
) -> PruneReport:
    """:func:`prune` with the store and Redis of ``settings``, opened for this run and
    closed after it. Safe from any process at any time. The scheduled job opens (and
    migrates) the store as a worker does; ``existing_store`` (the command) opens only a
    store that is there, as every command does (:class:`StoreMissing` otherwise)."""
    Archive(settings.archive_path).check_usable(dry_run)
    timeout_ms = max(settings.store_timeout_ms, PRUNE_TIMEOUT_MS)
    url, synchronous = settings.store_dsn(), settings.sqlite_synchronous
    if existing_store:
        store = open_existing_store(url, timeout_ms, synchronous)
    else:
        store = open_store(url, timeout_ms, synchronous)
        store.migrate()
    records = retention_records(settings)
    try:
        return prune(settings, store, store, records, now, dry_run, progress)
    finally:
        store.close()
        if records is not None:
            records.close()


def retention_records(settings: Settings) -> RetentionRecords | None:
    """The prune's Redis (None when the deployment has none configured, nor an embedded
    one running: the lease log then waits for a run that has one)."""
    try:
        return RetentionRecords.from_url(settings.redis_dsn(), settings.keys)
    except ConfigError:
        return None


def prune(
    settings: Settings,
    store: RetentionStore,
    journal: JournalStore,
    records: RetentionRecords | None,
    now: float | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    faults: Faults | None = None,
) -> PruneReport:
    """Archive and remove what is past its retention at ``now`` (see the module
    docstring; ``journal`` says which sources it holds rows of: the same connection as
    ``store``); with ``dry_run``, only count it. Returns what was done, or why nothing
    was (another prune of this store is running)."""
    from ..routing.contract.sources import load_sources  # the prune's; not `keylane status`'s

    now = time.time() if now is None else now
    report = PruneReport(started_at=time.time(), dry_run=dry_run)
    with store.maintenance_lock() as mine:
        if not mine:
            report.skipped = "another prune of this store is running"
            report.finished_at = time.time()
            return report
        run = _Run(settings, store, journal, records, report, progress, faults)
        if not dry_run:
            run.recover()
        run.journal(now, load_sources(settings))
        run.table("dead_letters", now - settings.dead_letter_retention_s)
        with _without_redis(report, "the lease log was left for the next run"):
            run.lease_log(now - settings.lease_log_retention_s)
        if not dry_run:
            run.forget_ids(now - settings.archived_id_retention_s)
            run.reclaim()
    report.sizes = store.table_ages()
    report.finished_at = time.time()
    if records is not None:
        with _without_redis(report, "status and metrics show the previous prune"):
            report.sizes["lease_log"] = TableAge(*records.lease_log_age())
            if not dry_run:
                records.record(*report_figures(report))
    _log(report)
    return report


@contextmanager
def _without_redis(report: PruneReport, consequence: str) -> Iterator[None]:
    """Go on without Redis (down or unreachable): the store's part does not need it."""
    try:
        yield
    except BrokerUnavailable as exc:
        report.warnings.append(f"Redis unavailable ({exc}): {consequence}")
        log.warning("prune: Redis unavailable (%s): %s", exc, consequence)


def journal_retention_s(settings: Settings, sources: Sources, source: str) -> int:
    """How long ``source``'s journal rows stay in the table (a source the sources file
    no longer names: the deployment's defaults)."""
    config = sources.get(source)
    if config is not None:
        return config.journal_retention(settings)
    floor = settings.dedupe_retention_s + settings.journal_margin_s
    return max(settings.journal_retention_s or 0, floor)


class _Run:
    """One prune run, holding the store's maintenance lock."""

    def __init__(
        self,
        settings: Settings,
        store: RetentionStore,
        journal_store: JournalStore,
        records: RetentionRecords | None,
        report: PruneReport,
        progress: Progress | None,
        faults: Faults | None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.journal_store = journal_store
        self.records = records
        self.report = report
        self.progress = progress or (lambda table, done, due: None)
        self.faults = faults if faults is not None else Faults(settings.faults, crash)
        self.archive = Archive(settings.archive_path, self.faults)
        self.batch_rows = settings.prune_batch_rows
        self.pause_s = settings.prune_pause_ms / 1000

    def recover(self) -> None:
        """Settle the files an interrupted run left pending; delete half-written ones."""
        self.report.removed_temporaries = self.archive.remove_temporaries()
        for table, path in self.archive.pending():
            if table == "lease_log" and self.records is None:
                continue  # settled by a run that reaches Redis
            with _without_redis(self.report, f"{path.name} was left for the next run"):
                self._settle(table, path, read_rows(path))
                self.report.recovered_files += 1

    def journal(self, now: float, sources: Sources) -> None:
        """Every source's journal rows past that source's retention."""
        names = sorted(set(self.journal_store.journal_sources()) | set(sources.names()))
        for source in names:
            retention = journal_retention_s(self.settings, sources, source)
            self.report.tables["journal"].retention_s[source] = retention
            self.table("journal", now - retention, source)
            # Its kept deliveries go with its journal rows, after the same window.
            self.report.tables["deliveries"].retention_s[source] = retention
            self.table("deliveries", now - retention, source)

    def table(self, table: PrunedTable, before: float, source: str = "") -> None:
        """Archive ``table``'s rows due before ``before``, one file at a time."""
        rep = self.report.tables[table]
        if table == "dead_letters":
            rep.retention_s[""] = self.settings.dead_letter_retention_s
        due = self.store.count_old_rows(table, before, source)
        rep.due += due
        if self.report.dry_run or due == 0:
            return
        done = 0
        while rows := self.store.old_rows(table, before, FILE_ROWS, source):
            moved = self._archive(table, rows, _TIME_FIELD[table])
            done += len(rows)
            self.progress(f"{table} {source}".strip(), done, max(due, done))
            if not moved:
                break  # every row read changed meanwhile: nothing is due any more

    def lease_log(self, before: float) -> None:
        """Lease-log entries written before ``before`` (Redis: skipped without it)."""
        rep = self.report.tables["lease_log"]
        rep.retention_s[""] = self.settings.lease_log_retention_s
        if self.records is None:
            return
        before_ms = int(before * 1000)
        if self.report.dry_run:
            rep.due = len(self.records.lease_entries_before(before_ms, FILE_ROWS * 4))
            return
        done = 0
        while entries := self.records.lease_entries_before(before_ms, FILE_ROWS):
            rep.due += len(entries)
            rows: list[ArchiveRow] = [
                {**entry, "written_at": int(entry["id"].split("-")[0]) / 1000} for entry in entries
            ]
            moved = self._archive("lease_log", rows, "written_at")
            done += len(entries)
            self.progress("lease_log", done, done)
            if not moved:
                break

    def forget_ids(self, before: float) -> None:
        """Forget archived ids recorded before ``before``, a batch at a time."""
        while True:
            removal = self.store.forget_archived_ids(before, self.batch_rows)
            self._timed(removal.held_s)
            self.report.forgotten_ids += removal.forgotten
            if removal.forgotten < self.batch_rows:
                return
            self._pause(removal.held_s)

    def reclaim(self) -> None:
        """Make the removed rows' space reusable (PostgreSQL: VACUUM where they piled up)."""
        started = time.perf_counter()
        self.report.reclaimed = self.store.reclaim_space()
        self.report.reclaim_s = time.perf_counter() - started

    def _archive(self, table: str, rows: Sequence[ArchiveRow], time_field: str) -> int:
        """Write ``rows`` to one pending file per day, then settle each; rows moved."""
        moved = 0
        for day, group in _by_day(rows, time_field):
            path = self.archive.write_pending(table, day, group)
            self.faults.hit("prune.after_file", table)
            moved += self._settle(table, path, group)
        return moved

    def _settle(self, table: str, path: Path, rows: list[ArchiveRow]) -> int:
        """Remove the rows of the pending file ``path`` from their table, a batch per
        transaction, then make the file final with the rows that left; how many left."""
        kept: list[ArchiveRow] = []
        for start in range(0, len(rows), self.batch_rows):
            removal = self._remove(table, rows[start : start + self.batch_rows])
            kept += removal.archived
            self._timed(removal.held_s)
            self.faults.hit("prune.after_batch", f"{table}:{self.report.batches}")
            if start + self.batch_rows < len(rows):
                self._pause(removal.held_s)
        final = self.archive.settle(path, kept, len(rows))
        rep = self.report.tables[table]
        rep.archived += len(kept)
        rep.kept += len(rows) - len(kept)
        rep.files += final is not None
        return len(kept)

    def _remove(self, table: str, batch: list[ArchiveRow]) -> Removal:
        """Remove one batch, again while the store is busy (the lanes come first: on
        SQLite the prune takes the write lock between their transactions, and removing
        twice is removing once); the store's error after ``BUSY_RETRIES`` tries."""
        if table == "lease_log":
            assert self.records is not None
            started = time.perf_counter()
            self.records.delete_lease_entries([row["id"] for row in batch])
            # Entries never change: each is archived once it is gone.
            return Removal(batch, held_s=time.perf_counter() - started)
        for attempt in range(BUSY_RETRIES):
            try:
                return self.store.remove_archived(_PRUNED[table], batch)
            except StoreUnavailable:
                if attempt == BUSY_RETRIES - 1:
                    raise
                self.report.busy_retries += 1
                time.sleep(self.pause_s)
        raise AssertionError("unreachable")

    def _timed(self, held_s: float) -> None:
        self.report.batches += 1
        self.report.longest_batch_s = max(self.report.longest_batch_s, held_s)
        self.report.batch_s.append(held_s)

    def _pause(self, batch_s: float) -> None:
        """Let the lanes write between two delete transactions: at least as long as the
        last one took. A lane that waited on it for up to that long is then let in before
        the next one: SQLite's busy wait polls again within at most the time it has
        waited so far (1, 2, 5, 10, 15, 20, 25 ms ... 100 ms apart), or 10 ms."""
        time.sleep(max(self.pause_s, batch_s))


def _by_day(rows: Sequence[ArchiveRow], time_field: str) -> Iterator[tuple[str, list[ArchiveRow]]]:
    days: dict[str, list[ArchiveRow]] = {}
    for row in rows:
        days.setdefault(day_of(float(row[time_field])), []).append(row)
    yield from sorted(days.items())


def _log(report: PruneReport) -> None:
    if report.dry_run:
        return
    moved = ", ".join(f"{t} {r.archived}" for t, r in report.tables.items())
    log.info(
        "prune: archived %s; forgot %d ids; %d batches, longest %.3f s",
        moved,
        report.forgotten_ids,
        report.batches,
        report.longest_batch_s,
    )
