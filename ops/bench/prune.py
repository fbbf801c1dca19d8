"""The store over time, with retention: ``python -m keylane.ops.bench.prune``.

Three measurements, each against a baseline taken in the same run, on ``--store``
(``sqlite``, ``postgres`` or both), in a private store removed at the end:

* ``soak``: ``--events`` events written as a worker's lanes write them (group commits
  of ``--group`` events, each a record's read-modify-write and its journal entry, over
  ``--keys`` records) with the journal's retention set to ``--retention-s`` and a prune
  every ``--prune-every-s`` (in its own thread and connection, as a scheduled job runs
  beside the lanes). After every twentieth of the events it prints the store's bytes
  (the SQLite file and its WAL, or the schema's relations on PostgreSQL) by table, and
  the archive's. Baseline: bytes per event while nothing was yet due. At the end every
  event must be in the table or the archive exactly once and every record must hold
  its exact sum (exit code 1 otherwise).
* ``lanes``: ``--writers`` threads commit groups of events back to back (the lanes),
  first alone, then while a prune archives ``--backlog`` rows past their retention; the
  commits' latency in both phases beside the prune's delete transactions.
* ``writepath``: single-event commits per second on the store as migrated, against the
  same with ``archived_ids`` holding ``--ids`` ids, without the journal's age index, and
  without the archived-id check (the cost of what retention adds to each write).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import click

from ...routing.contract.settings import Settings
from ...routing.contract.settings_env import load_settings, settings_environ
from ...workers.store import RecordStore
from ...workers.store_rows import Commit, EventWrite
from ...workers.stores import open_store
from ...workers.stores import sql_journal as journal_sql
from ...workers.stores.sql import SqlStore
from ..archive import read_rows
from ..prune_report import PruneReport
from ..retention import prune
from .procs import fresh_store_url, say

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
MIB = 1024 * 1024


# -- the writers ------------------------------------------------------------------------------


@dataclass
class Writer:
    """Events written as a worker's group commit writes them: each a read-modify-write of
    its record (revisions kept here: this writer is the only one) and a journal entry."""

    store: RecordStore
    keys: int
    group: int
    prefix: str = "soak"
    gap_s: float = 0.0  # between two commits: a lane's acknowledgement and next take
    rate: float = 0.0  # events per second at most (0: as fast as the store goes)
    written: int = 0
    started: float = field(default_factory=time.perf_counter)
    revisions: dict[int, int] = field(default_factory=dict)
    totals: dict[int, int] = field(default_factory=dict)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (time, seconds)

    def commit_next(self, count: int) -> None:
        """Commit the next ``count`` events, ``group`` per transaction."""
        end = self.written + count
        while self.written < end:
            n = min(self.group, end - self.written)
            commits = [self._commit(self.written + i) for i in range(n)]
            started = time.perf_counter()
            at = time.time()
            results = self.store.commit_group(commits)
            self.latencies.append((at, time.perf_counter() - started))
            for i, result in enumerate(results):
                if isinstance(result, Exception):
                    raise RuntimeError(f"event {self.written + i}: {result}")
                key = (self.written + i) % self.keys
                self.revisions[key] = int(result)
                self.totals[key] = self.totals.get(key, 0) + increment(self.written + i)
            self.written += n
            ahead = (
                self.written / self.rate - (time.perf_counter() - self.started) if self.rate else 0
            )
            time.sleep(max(self.gap_s, ahead))

    def _commit(self, i: int) -> Commit:
        key = i % self.keys
        total = self.totals.get(key, 0) + increment(i)
        write = EventWrite(
            "demo",
            event_id(self.prefix, i),
            f"{self.prefix}:{key}",
            key % 64,
            {"n": total},
            self.revisions.get(key, 0),
            1,
        )
        return Commit((write,), None)


def event_id(prefix: str, i: int) -> str:
    """Event ``i``'s id: random-looking, as senders' ids are (``evt_`` and 24 hex digits,
    Stripe's length), ending in ``-<i>``."""
    token = hashlib.blake2b(f"{prefix}{i}".encode(), digest_size=12).hexdigest()
    return f"evt_{token}-{i}"


def increment(i: int) -> int:
    """What event ``i`` adds to its record."""
    return (i * 7919) % 13 + 1


# -- sizes ---------------------------------------------------------------------------------


def store_bytes(store: SqlStore, url: str) -> dict[str, int]:
    """The store's bytes by table (indexes included), and ``total``."""
    with store.dialect.cursor() as cur:
        if url.startswith("sqlite"):
            cur.execute(
                "SELECT COALESCE(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d "
                "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"
            )
            sizes = {str(r[0]): int(r[1]) for r in cur.fetchall()}
            path = Path(url[len("sqlite://") :])
            wal = Path(f"{path}-wal")
            sizes["total"] = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
            return sizes
        cur.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        )
        sizes = {str(r[0]): int(r[1]) for r in cur.fetchall()}
        sizes["total"] = sum(sizes.values())
        return sizes


def folder_bytes(root: Path) -> int:
    """Bytes of every file under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# -- soak ------------------------------------------------------------------------------------


@dataclass
class SoakSample:
    """The store after some events."""

    events: int
    elapsed_s: float
    journal_rows: int
    oldest_age_s: float  # of the journal's oldest row: the retention, plus the prune's lag
    id_rows: int
    archived: int
    sizes: dict[str, int]
    archive_bytes: int


class Pruner(threading.Thread):
    """A prune every ``every_s`` on its own connection, as a scheduled job runs."""

    def __init__(self, settings: Settings, every_s: float) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.every_s = every_s
        self.stop = threading.Event()
        self.reports: list[PruneReport] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        store = open_store(self.settings.store_dsn())
        try:
            while not self.stop.wait(self.every_s):
                self.reports.append(prune(self.settings, store, store, None))
        except BaseException as exc:
            self.error = exc
        finally:
            store.close()

    @property
    def archived(self) -> int:
        return sum(r.tables["journal"].archived for r in self.reports)


def soak(kind: str, url: str, tmp: Path, opts: dict[str, Any]) -> list[str]:
    """Run the soak on one store; the problems found (none: every invariant held)."""
    settings = retention_settings(url, tmp, opts["retention_s"], opts["id_retention_s"])
    store = open_store(url)
    store.migrate()
    writer = Writer(store, opts["keys"], opts["group"], "soak", opts["gap_ms"] / 1000, opts["rate"])
    pruner = Pruner(settings, opts["prune_every_s"])
    samples = [_sample(store, url, settings, 0, 0.0, 0)]
    chunk = -(-opts["events"] // 20)
    started = time.perf_counter()
    pruner.start()
    try:
        while writer.written < opts["events"]:
            writer.commit_next(min(chunk, opts["events"] - writer.written))
            elapsed = time.perf_counter() - started
            samples.append(_sample(store, url, settings, writer.written, elapsed, pruner.archived))
            say(f"{kind}: {writer.written:,} events, {samples[-1].sizes['total'] / MIB:.1f} MiB")
            if pruner.error is not None:
                raise pruner.error
    finally:
        pruner.stop.set()
        pruner.join()
    _print_soak(kind, opts, samples, pruner.reports)
    problems = _check_soak(store, settings, writer)
    store.close()
    return problems


def retention_settings(url: str, tmp: Path, retention_s: int, id_retention_s: int) -> Settings:
    """A deployment whose journal keeps ``retention_s`` and archived ids ``id_retention_s``."""
    return load_settings(
        data_dir=tmp,
        store_url=url,
        dedupe_retention_s=retention_s,
        journal_margin_s=0,
        archived_id_retention_s=id_retention_s,
    )


def _sample(
    store: SqlStore, url: str, s: Settings, events: int, elapsed: float, archived: int
) -> SoakSample:
    ages = store.table_ages()
    oldest = ages["journal"].oldest
    return SoakSample(
        events,
        elapsed,
        ages["journal"].rows,
        0.0 if oldest is None else time.time() - oldest,
        ages["archived_ids"].rows,
        archived,
        store_bytes(store, url),
        folder_bytes(s.archive_path),
    )


def _print_soak(
    kind: str, opts: dict[str, Any], samples: list[SoakSample], reports: list[PruneReport]
) -> None:
    print(
        f"\n== soak on {kind}: {opts['events']:,} events over {opts['keys']:,} records, "
        f"groups of {opts['group']} {opts['gap_ms']} ms apart, at most {opts['rate']:.0f}/s; "
        "journal retention "
        f"{opts['retention_s']} s, archived ids {opts['id_retention_s']} s, a prune every "
        f"{opts['prune_every_s']} s"
    )
    print(
        "EVENTS     ELAPSED S  JOURNAL ROWS  OLDEST S  ARCHIVED   STORE MIB  JOURNAL MIB  "
        "IDS MIB  RECORDS MIB  ARCHIVE MIB"
    )
    for s in samples:
        print(
            f"{s.events:<10,} {s.elapsed_s:<10.0f} {s.journal_rows:<13,} "
            f"{s.oldest_age_s:<9.0f} {s.archived:<10,} "
            f"{s.sizes['total'] / MIB:<10.1f} {s.sizes.get('journal', 0) / MIB:<12.1f} "
            f"{s.sizes.get('archived_ids', 0) / MIB:<8.1f} "
            f"{s.sizes.get('records', 0) / MIB:<12.1f} "
            f"{s.archive_bytes / MIB:.1f}"
        )
    before = max((s for s in samples if s.archived == 0 and s.events), key=lambda s: s.events)
    last = samples[-1]
    half = samples[len(samples) // 2]
    base = samples[0].sizes["total"]
    print(
        f"bytes per event in the store, nothing yet archived ({before.events:,} events): "
        f"{(before.sizes['total'] - base) / before.events:.0f} "
        f"(journal {before.sizes.get('journal', 0) / max(1, before.journal_rows):.0f} per row)"
    )
    first = [x.sizes["total"] / MIB for x in samples[: len(samples) // 2 + 1]]
    second = [x.sizes["total"] / MIB for x in samples[len(samples) // 2 :]]
    print(
        f"bytes per event in the store after {last.events:,} events: "
        f"{(last.sizes['total'] - base) / last.events:.0f}; the store's largest "
        f"{max(first):.1f} MiB in the first half ({half.events:,} events), "
        f"{min(second):.1f} to {max(second):.1f} MiB in the second"
    )
    ids = last.sizes.get("archived_ids", 0)
    id_rows = max(1, last.id_rows)
    print(
        f"archive: {last.archive_bytes / max(1, last.archived):.0f} bytes per archived event "
        f"(gzipped JSON lines); archived ids: {ids / id_rows:.0f} bytes per id"
    )
    held = sorted(h for r in reports for h in r.batch_s)
    if len(held) > 1:
        q = statistics.quantiles(held, n=100)
        print(
            f"prunes: {len(reports)}, {len(held)} delete transactions holding the store "
            f"p50 {q[49] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms, max {held[-1] * 1000:.0f} ms"
        )
    vacuums = [r.reclaim_s for r in reports if r.reclaimed]
    if vacuums:
        print(
            f"vacuums: {len(vacuums)} of {len(reports)} prunes, median "
            f"{statistics.median(vacuums) * 1000:.0f} ms, longest {max(vacuums) * 1000:.0f} ms"
        )


def _check_soak(store: SqlStore, settings: Settings, writer: Writer) -> list[str]:
    """Every event in exactly one place (table or archive), every record its exact sum."""
    seen = bytearray(writer.written)
    problems: list[str] = []

    def mark(event_id: str, where: str) -> None:
        i = int(event_id.rsplit("-", 1)[1])
        if seen[i]:
            problems.append(f"{event_id} twice (again in {where})")
        seen[i] = 1

    for entry in store.journal_entries():
        mark(entry.event_id, "the table")
    for path in sorted((settings.archive_path / "journal").rglob("*.jsonl.gz*")):
        for row in read_rows(path):
            mark(row["event_id"], path.name)
    missing = seen.count(0)
    if missing:
        problems.append(f"{missing} events in neither the table nor the archive")
    for key, total in writer.totals.items():
        found = store.read(f"{writer.prefix}:{key}").fields.get("n")
        if found != total:
            problems.append(f"{writer.prefix}:{key}: n={found}, expected {total}")
    return problems[:20]


# -- lanes during a prune -----------------------------------------------------------------------


def lanes(kind: str, url: str, tmp: Path, opts: dict[str, Any]) -> list[str]:
    """Commit latencies with and without a prune running (``keylane journal prune``, in
    its own process, as a scheduled job runs); the problems found."""
    settings = retention_settings(url, tmp, 60, 86400)
    store = open_store(url)
    store.migrate()
    backlog = Writer(store, 1000, 256, prefix="old")
    say(f"{kind}: writing a backlog of {opts['backlog']:,} events")
    backlog.commit_next(opts["backlog"])
    with store.dialect.transaction() as cur:
        cur.execute("UPDATE journal SET recorded_at = recorded_at - 86400")  # a day old
    writers = [
        Writer(open_store(url), opts["keys"], opts["group"], f"w{n}", opts["gap_ms"] / 1000)
        for n in range(opts["writers"])
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=_write_until, args=(w, stop)) for w in writers]
    for t in threads:
        t.start()
    baseline_from = time.time()
    time.sleep(opts["baseline_s"])
    report = _prune_in_a_process(settings)
    time.sleep(1)
    stop.set()
    for t in threads:
        t.join()
    prune_from, prune_to = report["started_at"], report["finished_at"]
    latencies = [x for w in writers for x in w.latencies]
    alone = [s for t, s in latencies if baseline_from <= t < prune_from]
    during = [s for t, s in latencies if prune_from <= t < prune_to]
    archived = report["tables"]["journal"]["archived"]
    print(
        f"\n== lanes on {kind}: {opts['writers']} writer(s), groups of {opts['group']} "
        f"{opts['gap_ms']} ms apart; a prune (its own process) of {archived:,} rows "
        f"({settings.prune_batch_rows} per delete transaction) in {prune_to - prune_from:.1f} s"
    )
    print("PHASE        COMMITS  EVENTS/S  P50 MS  P99 MS  MAX MS")
    for name, values, span in (
        ("alone", alone, prune_from - baseline_from),
        ("during prune", during, prune_to - prune_from),
    ):
        q = statistics.quantiles(values, n=100) if len(values) > 1 else [0.0] * 99
        print(
            f"{name:<12} {len(values):<8} {len(values) * opts['group'] / span:<9.0f} "
            f"{q[49] * 1000:<7.1f} {q[98] * 1000:<7.1f} {max(values, default=0) * 1000:.1f}"
        )
    print(
        f"prune: {report['batches']} delete transactions holding the store p50 "
        f"{report['batch_p50_s'] * 1000:.1f} ms, p99 {report['batch_p99_s'] * 1000:.1f} ms, "
        f"max {report['longest_batch_s'] * 1000:.1f} ms ({report['busy_retries']} tried again "
        f"while the store was busy; vacuumed {report['reclaimed'] or 'nothing'} in "
        f"{report['reclaim_s']:.1f} s); the slowest commit during the prune took "
        f"{max(during, default=0) * 1000:.1f} ms, alone {max(alone, default=0) * 1000:.1f} ms"
    )
    for w in writers:
        w.store.close()
    store.close()
    return [] if archived == opts["backlog"] else [f"{opts['backlog'] - archived} rows left"]


def _prune_in_a_process(settings: Settings) -> dict[str, Any]:
    """Run ``keylane journal prune --json`` for ``settings``' deployment; its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env.update(settings_environ(settings))
    ran = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "journal", "prune", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if ran.returncode != 0:
        raise RuntimeError(f"keylane journal prune failed: {ran.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(ran.stdout)
    return report


def _write_until(writer: Writer, stop: threading.Event) -> None:
    while not stop.is_set():
        writer.commit_next(writer.group)


# -- the write path -------------------------------------------------------------------------------


def writepath(kind: str, url: str, tmp: Path, opts: dict[str, Any]) -> list[str]:
    """Single-event commits per second with and without what retention adds: ``--rounds``
    rounds, each variant once per round in turn (a busy machine slows them alike); the
    median round of each."""
    variants = [
        ("as migrated (archived_ids empty)", None),
        (f"archived_ids holding {opts['ids']:,} ids", "ids"),
        ("without the journal's age index", "no-index"),
        ("without the archived-id check", "no-check"),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in variants}
    with contextlib.ExitStack() as es:
        writers = {}
        for n, (name, variant) in enumerate(variants):
            store = open_store(
                es.enter_context(fresh_store_url(kind, tmp, opts["pg_url"], f"wp{n}"))
            )
            es.callback(store.close)
            store.migrate()
            if variant == "ids":
                _fill_ids(store, opts["ids"])
            if variant == "no-index":
                with store.dialect.transaction() as cur:
                    cur.execute("DROP INDEX journal_age")
            writers[name] = (Writer(store, 1000, 1, prefix="wp"), variant)
            writers[name][0].commit_next(200)  # warm up
        for _ in range(opts["rounds"]):
            for name, (writer, variant) in writers.items():
                check = (
                    mock.patch.object(journal_sql, "archived_at", return_value=None)
                    if variant == "no-check"
                    else contextlib.nullcontext()
                )
                with check:
                    started = time.perf_counter()
                    writer.commit_next(opts["commits"])
                    rates[name].append(opts["commits"] / (time.perf_counter() - started))
    print(
        f"\n== write path on {kind}: {opts['commits']:,} single-event commits per variant "
        f"and round, {opts['rounds']} rounds (median)"
    )
    print("VARIANT                              COMMITS/S  vs FIRST  ROUNDS")
    first = statistics.median(rates[variants[0][0]])
    for name, _ in variants:
        median = statistics.median(rates[name])
        rounds = " ".join(f"{r:.0f}" for r in rates[name])
        print(f"{name:<36} {median:<10.0f} {median / first:<9.2f} {rounds}")
    return []


def _fill_ids(store: SqlStore, count: int) -> None:
    now = int(time.time())
    with store.dialect.transaction() as cur:
        for start in range(0, count, 5000):
            n = min(5000, count - start)
            values = ", ".join("(?, ?)" for _ in range(n))
            params = [
                v
                for i in range(start, start + n)
                for v in (journal_sql.id_hash("demo", f"old-{i}"), now)
            ]
            sql = f"INSERT INTO archived_ids (id_hash, recorded_at) VALUES {values}"  # noqa: S608 - placeholders only
            cur.execute(sql, params)


# -- the command ----------------------------------------------------------------------------------

RUNS = {"soak": soak, "lanes": lanes, "writepath": writepath}


@click.command()
@click.option("--only", type=click.Choice(list(RUNS)), multiple=True, help="Default: all.")
@click.option("--store", "stores", default="sqlite", help="sqlite, postgres, or both (comma).")
@click.option("--pg-url", default=DEFAULT_PG_URL, show_default=True)
@click.option("--events", default=1_000_000, show_default=True, help="soak: events written.")
@click.option("--keys", default=10_000, show_default=True, help="Records written to.")
@click.option("--group", default=32, show_default=True, help="Events per commit group.")
@click.option("--gap-ms", default=1.0, show_default=True, help="Pause after each commit.")
@click.option("--rate", default=2000.0, show_default=True, help="soak: events/s at most.")
@click.option("--retention-s", default=60, show_default=True, help="soak: journal retention.")
@click.option("--id-retention-s", default=180, show_default=True, help="soak: archived ids.")
@click.option("--prune-every-s", default=10.0, show_default=True, help="soak: prune interval.")
@click.option("--backlog", default=200_000, show_default=True, help="lanes: rows to prune.")
@click.option("--writers", default=0, help="lanes: writer threads (0: 1 SQLite, 2 PostgreSQL).")
@click.option("--baseline-s", default=5.0, show_default=True, help="lanes: time alone first.")
@click.option("--commits", default=1000, show_default=True, help="writepath: per round.")
@click.option("--rounds", default=5, show_default=True, help="writepath: rounds.")
@click.option("--ids", default=1_000_000, show_default=True, help="writepath: archived ids.")
def main(only: tuple[str, ...], stores: str, **opts: Any) -> None:
    """Store size, lane latency and write cost with retention (see the module docstring)."""
    # A SIGTERM unwinds like Ctrl-C: the temporary store and directory are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    problems: list[str] = []
    for kind in [k.strip() for k in stores.split(",")]:
        writers = opts["writers"] or (1 if kind == "sqlite" else 2)
        for name in only or list(RUNS):
            with (
                tempfile.TemporaryDirectory(prefix="klbench-ret-") as tmp,
                fresh_store_url(kind, Path(tmp), opts["pg_url"], name) as url,
            ):
                problems += RUNS[name](kind, url, Path(tmp), {**opts, "writers": writers})
    for problem in problems:
        print(f"PROBLEM {problem}")
    print("invariants: OK" if not problems else f"invariants: {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
