"""The prune (ops/retention.py) against real stores, Redis and processes: what leaves and
what stays, the archive files, ``keylane journal find``, a prune killed at each point and
run again, the lanes applying while it runs, and a delivery replayed after its row left
the table."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from keylane.ops.archive import PENDING, SETTLED, Archive, read_rows
from keylane.ops.lookup import find_events
from keylane.ops.retention import RetentionRecords, prune
from keylane.routing.contract.settings import Settings
from keylane.workers.store import JournalStore
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.readme import page_block
from tests.support.stack import REPO, Stack, event, send_all, settings_env, wait_until
from tests.test_store import draft

DAY = 86400
SOURCES = """
[sources.old]
batch = 1

[sources.young]
journal_retention_s = 3600

[sources.demo]
journal_retention_s = 3600
"""


def seed(store: SqlStore, count: int, source: str, prefix: str = "e", key_count: int = 50) -> None:
    """Journal ``count`` applied events of ``source`` (no record change), in bulk."""
    now = time.time()
    rows = [(source, f"{prefix}{i}", f"k:{i % key_count}", now) for i in range(count)]
    with store.dialect.transaction() as cur:
        for start in range(0, count, 500):
            chunk = rows[start : start + 500]
            values = ", ".join("(?, ?, ?, 1, 'applied', NULL, 1, ?, NULL)" for _ in chunk)
            cur.execute(
                "INSERT INTO journal (source, event_id, record_key, shard, outcome, revision, "
                f"attempts, recorded_at, fence) VALUES {values}",
                [v for row in chunk for v in row],
            )


def with_sources(settings: Settings, tmp_path: Path, text: str = SOURCES, **more: Any) -> Settings:
    """``settings`` with a sources file holding ``text`` (and other settings changed)."""
    path = tmp_path / "sources.toml"
    path.write_text(text)
    return settings.model_copy(update={"sources_file": path, **more})


def archived(settings: Settings, table: str = "journal") -> list[tuple[Path, dict[str, Any]]]:
    """Every row in the archive's complete files (settled or pending), with its file."""
    root = settings.archive_path / table
    files = sorted(p for p in root.glob("*/*") if p.name.endswith((SETTLED, PENDING)))
    return [(path, row) for path in files for row in read_rows(path)]


def journal_ids(store: JournalStore) -> list[tuple[str, str]]:
    return [(e.source, e.event_id) for e in store.journal_entries()]


def keylane(settings: Settings, *args: str, **extra: Any) -> subprocess.CompletedProcess[str]:
    """Run the ``keylane`` command against the test's deployment."""
    return subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *args],
        env=settings_env(settings, **extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- what leaves, and what stays -----------------------------------------------------------


def test_a_prune_archives_what_is_past_its_retention_and_keeps_the_rest(
    settings: Settings, store: SqlStore, redis_url: str, tmp_path: Path
) -> None:
    # Given sources with a journal retention of 1,000 s (young) and the floor (old: its
    # dedupe retention of 100 s), review rows, and a lease log with two old entries
    s = with_sources(
        settings,
        tmp_path,
        dedupe_retention_s=100,
        journal_margin_s=0,
        dead_letter_retention_s=50,
        lease_log_retention_s=1000,
    )
    seed(store, 30, "old")
    seed(store, 20, "young", prefix="y")
    open_row = store.commit_dead_letter(draft("d1", source="old"), None)
    closed_row = store.commit_dead_letter(draft("d2", source="old"), None)
    store.set_dead_letter_status(closed_row, "resolved", ("open",), "ada")
    client = redis.Redis.from_url(redis_url)
    log_key = s.keys.lease_log
    client.xadd(log_key, {"event": "acquired", "shard": "1", "worker": "w", "token": "1"}, "1000-0")
    client.xadd(log_key, {"event": "released", "shard": "1", "worker": "w", "token": "1"}, "2000-0")
    client.xadd(log_key, {"event": "acquired", "shard": "1", "worker": "v", "token": "2"})
    records = RetentionRecords.from_url(redis_url, s.keys)
    now = time.time() + 500
    try:
        # When a dry run looks first
        dry = prune(s, store, store, records, now=now, dry_run=True)
        # Then it counts what is due and changes nothing
        assert dry.tables["journal"].due == 31  # old's 30, and the resolved event's
        assert dry.tables["dead_letters"].due == 1
        assert dry.tables["lease_log"].due == 2
        assert dry.tables["journal"].retention_s == {"demo": 3600, "old": 100, "young": 3600}
        assert len(store.journal_entries()) == 52  # 30 + 20 + the two dead letters'
        assert not s.archive_path.exists()
        # When the prune runs 500 s from now
        report = prune(s, store, store, records, now=now)
        # Then old's rows (and the resolved row's event) left, young's stayed
        assert report.tables["journal"].archived == 31
        assert {src for src, _ in journal_ids(store)} == {"young", "old"}
        assert [i for src, i in journal_ids(store) if src == "old"] == ["d1"]  # open: kept
        # And every archived row is in the archive once, in a settled file
        rows = archived(s)
        assert sorted(r["event_id"] for _, r in rows) == sorted(
            [f"e{i}" for i in range(30)] + ["d2"]
        )
        assert all(p.name.endswith(SETTLED) for p, _ in rows)
        # And the resolved review row and the two old lease entries were archived too
        assert [r["id"] for _, r in archived(s, "dead_letters")] == [closed_row]
        assert store.dead_letter(closed_row) is None
        assert store.dead_letter(open_row) is not None
        assert [r["id"] for _, r in archived(s, "lease_log")] == ["1000-0", "2000-0"]
        assert client.xlen(log_key) == 1
        # And the figures are recorded for status and metrics
        figures = records.figures()
        assert figures["journal_rows"] == 21
        assert figures["archived_journal"] == 31
        assert figures["lease_log_rows"] == 1
        assert figures["last_prune_at"] >= report.started_at
        # When it runs again at the same time
        again = prune(s, store, store, records, now=now)
        # Then nothing more is due
        assert sum(t.archived for t in again.tables.values()) == 0
        assert len(archived(s)) == 31
        # And later, young's rows go too
        later = prune(s, store, store, records, now=now + 3600)
        assert later.tables["journal"].archived == 20
    finally:
        records.close()
        client.close()


def test_a_second_prune_of_the_same_store_at_once_is_skipped(
    settings: Settings, store: SqlStore
) -> None:
    # Given a prune holding the store's lock (another process, another connection)
    other = open_store(settings.store_dsn())
    try:
        with other.maintenance_lock() as mine:
            assert mine
            # When another prune starts
            report = prune(settings, store, store, None, now=time.time() + 10 * DAY)
        # Then it does nothing and says why
        assert report.skipped is not None
    finally:
        other.close()


# -- a prune killed at any point, then run again ---------------------------------------------

KILL_POINTS = {
    "writing a file": {"point": "prune.before_rename", "match": "journal"},
    "file written, nothing deleted": {"point": "prune.after_file", "match": "journal"},
    "three batches deleted": {"point": "prune.after_batch", "match": "journal:3"},
}
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
# The store's part (the delete repeated, a row changed meanwhile) runs on both stores in
# tests/test_store_retention.py; the files' part is the same whatever the store.
KILLS = [
    pytest.param("sqlite", "writing a file"),
    pytest.param("sqlite", "file written, nothing deleted"),
    pytest.param("sqlite", "three batches deleted"),
    pytest.param("postgres", "three batches deleted"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("store_url", "where"), KILLS, indirect=["store_url"])
def test_a_prune_killed_mid_archive_then_run_again_leaves_each_row_in_one_place(
    settings: Settings, store: SqlStore, tmp_path: Path, where: str
) -> None:
    # Given 3,000 journal rows past their retention (1 s) and 100 that are not
    s = with_sources(
        settings, tmp_path, dedupe_retention_s=1, journal_margin_s=0, prune_batch_rows=500
    )
    seed(store, 3000, "old")
    seed(store, 100, "young", prefix="y")
    everything = set(journal_ids(store))
    time.sleep(1.2)
    # When `keylane journal prune` is killed (kill -9) at that point
    fault = {**KILL_POINTS[where], "action": "kill", "times": 1}
    killed = keylane(s, "journal", "prune", faults=[fault])
    assert killed.returncode == -9, killed.stdout + killed.stderr
    # Then no row is lost: each is in the table or in a complete archive file
    in_table = set(journal_ids(store))
    in_files = [(r["source"], r["event_id"]) for _, r in archived(s)]
    assert in_table | set(in_files) == everything
    # When it runs again
    rerun = prune(s, store, store, None)
    assert rerun.recovered_files == (0 if where == "writing a file" else 1)
    # Then every row is in exactly one place: the young in the table, the old archived
    in_table = set(journal_ids(store))
    in_files = [(r["source"], r["event_id"]) for _, r in archived(s)]
    assert len(in_files) == len(set(in_files)) == 3000
    assert in_table.isdisjoint(in_files)
    assert in_table | set(in_files) == everything
    assert {src for src, _ in in_table} == {"young"}
    # And no pending or half-written file is left
    assert not list(s.archive_path.rglob(f"*{PENDING}"))
    assert not list(s.archive_path.rglob(".*.tmp"))
    # And `keylane journal find` finds each row where it is (in the archive from the day
    # archived_ids names)
    archive = Archive(s.archive_path)
    for i in range(0, 3000, 97):
        lookup = find_events(store, archive, f"e{i}", "old")
        (found,) = lookup.found
        assert found.where.startswith("journal/")
        assert found.row["event_id"] == f"e{i}"
        assert found.row["record_key"] == f"k:{i % 50}"
    (found,) = find_events(store, archive, "y3").found
    assert found.where == "table"


# -- the lanes during a prune ------------------------------------------------------------------


@pytest.mark.slow
def test_lanes_keep_applying_while_a_prune_runs(stack: Stack, tmp_path: Path) -> None:
    # Given a deployment whose journal holds 10,000 rows past their retention
    stack.settings = with_sources(
        stack.settings,
        tmp_path,
        dedupe_retention_s=1,
        journal_margin_s=0,
        prune_batch_rows=500,
        prune_pause_ms=20,
    )
    store = stack.open_store()
    store.migrate()
    seed(store, 10_000, "old")
    stack.worker(lanes=8)
    stack.receiver()
    stack.wait_all_owned()
    time.sleep(1.1)
    # And senders posting increments to 20 records, all along
    sent: list[int] = []
    stop = threading.Event()

    def senders() -> None:
        n = 0
        while not stop.is_set():
            batch = [event(f"x{n + i}", f"c:{(n + i) % 20}", n={"increment": 1}) for i in range(40)]
            answers = send_all(stack, batch, senders=4, source="demo")
            assert all(a.status_code == 202 for a in answers)
            n += len(batch)
            sent.append(n)

    thread = threading.Thread(target=senders)
    thread.start()
    records = RetentionRecords.from_url(stack.settings.redis_dsn(), stack.settings.keys)
    try:
        wait_until(lambda: store.journal_size() > 10_000, 30, "first events applied")
        # When the prune archives the 10,000 rows
        report = prune(stack.settings, store, store, records)
    finally:
        stop.set()
        thread.join(60)
        records.close()
    total = sent[-1]
    stack.wait_journal(total + 10_000 - report.tables["journal"].archived, timeout_s=120)
    # Then it archived every old row and none of the new ones
    assert report.tables["journal"].archived == 10_000
    assert {src for src, _ in journal_ids(store)} == {"demo"}
    # And the lanes applied events while it ran
    during = [
        e
        for e in store.journal_entries()
        if report.started_at <= e.recorded_at <= report.finished_at
    ]
    assert len(during) > 0
    # And each event was applied exactly once
    assert sum(store.read(f"c:{k}").fields.get("n", 0) for k in range(20)) == total
    print(
        f"\nprune of 10,000 rows: {report.finished_at - report.started_at:.2f} s, "
        f"{report.batches} delete transactions, longest {report.longest_batch_s * 1000:.1f} ms; "
        f"{len(during)} events applied meanwhile"
    )


# -- a delivery replayed after its row was archived ---------------------------------------------


@pytest.mark.slow
def test_a_delivery_replayed_after_its_row_was_archived_has_no_second_effect(stack: Stack) -> None:
    replayed_after_archiving(stack, remembered=True)


@pytest.mark.slow
@SQLITE
def test_a_delivery_replayed_after_its_id_was_forgotten_is_a_new_event(stack: Stack) -> None:
    replayed_after_archiving(stack, remembered=False)


def replayed_after_archiving(stack: Stack, remembered: bool) -> None:
    """The README's promise for a delivery replayed after its journal row was archived."""
    # Given a deployment whose dedupe marks and journal rows last 1 s (and whose archived
    # ids are remembered for the default 30 days, or not at all)
    stack.settings = stack.settings.model_copy(
        update={
            "dedupe_retention_s": 1,
            "journal_margin_s": 0,
            "archived_id_retention_s": DAY * 30 if remembered else 0,
        }
    )
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    body = event("evt_1", "contact:42", visits={"increment": 1})
    assert stack.post(body).status_code == 202
    stack.wait_journal(1)
    store = stack.open_store()
    # When its dedupe mark has expired and the prune has archived its row
    time.sleep(3)  # past the window: an id is forgotten up to 2 s after it, never before
    records = RetentionRecords.from_url(stack.settings.redis_dsn(), stack.settings.keys)
    try:
        report = prune(stack.settings, store, store, records)
    finally:
        records.close()
    assert report.tables["journal"].archived == 1
    assert store.journal_size() == 0
    # And the sender delivers it again
    again = stack.post(body)
    # Then the receiver accepts it (Redis has forgotten the id) ...
    assert again.status_code == 202
    view = stack.view()
    if remembered:
        # ... and the lane recognises it from the archived id: no second effect
        wait_until(lambda: view.counters().get("duplicate", 0) == 1, 30, "the replay refused")
        assert store.read("contact:42").fields == {"visits": 1}
        assert store.journal_size() == 0
        entry = store.journal("demo", "evt_1")
        assert entry is not None
        assert entry.outcome == "archived"
    else:
        # ... and, its id forgotten, it is applied as a new event
        stack.wait_journal(1)
        assert store.read("contact:42").fields == {"visits": 2}
    # And `keylane journal find --all` shows the archived row (and the new one, if any)
    found = json.loads(
        keylane(stack.settings, "journal", "find", "evt_1", "--all", "--json").stdout
    )
    assert [r["where"] == "table" for r in found] == ([False] if remembered else [True, False])
    # And status and /metrics show the journal and the last prune
    status = json.loads(keylane(stack.settings, "status", "--json").stdout)["retention"]
    assert status["tables"]["journal"]["rows"] == (0 if remembered else 1)
    assert status["last_prune_age_s"] is not None
    assert status["archived_total"]["journal"] == 1
    metrics = httpx.get(f"{stack.ops_url}/metrics").text
    assert 'keylane_store_rows{table="journal"} 0.0' in metrics
    assert 'keylane_archived_rows_total{table="journal"} 1.0' in metrics
    assert "keylane_prune_last_run_timestamp_seconds" in metrics


# -- README -------------------------------------------------------------------------------------


def shape(line: str) -> str:
    """A line of output with its numbers, times and file names blanked out."""
    line = re.sub(r"journal/\S+\.jsonl\.gz", "<file>", line)
    return " ".join(re.sub(r"\d[\d,.:-]*", "#", line).split())


def backdate(store: SqlStore, table: str, column: str, seconds: float, prefix: str) -> None:
    """Move ``column`` back by ``seconds`` in ``table``'s rows of events named ``prefix``..."""
    with store.dialect.transaction() as cur:
        cur.execute(
            f"UPDATE {table} SET {column} = {column} - ? WHERE substr(event_id, 1, ?) = ?",
            (seconds, len(prefix), prefix),
        )


@SQLITE  # the commands print the same from either store
def test_the_readme_commands_run_as_written(
    settings: Settings, store: SqlStore, redis_url: str
) -> None:
    # Given the console example of the docs' page "Retention and the archive"
    example = page_block("retention.md", "$ keylane journal prune --dry-run")
    commands: list[tuple[str, list[str]]] = []
    for line in example.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    # And a deployment like the one it shows: ids archived 20 days ago, evt_1 and others
    # 5 days old, newer events, two review rows closed 40 days ago, a lease log
    seed(store, 3, "demo", prefix="old-")
    seed(store, 40, "demo", prefix="evt_", key_count=1000)
    seed(store, 5, "demo", prefix="new-")
    closed = [store.commit_dead_letter(draft(f"d{i}", source="demo"), None) for i in (1, 2)]
    for row in closed:
        store.set_dead_letter_status(row, "resolved", ("open",), "ada")
    backdate(store, "journal", "recorded_at", 20 * DAY, "old-")
    backdate(store, "journal", "recorded_at", 5 * DAY, "evt_")
    backdate(store, "journal", "recorded_at", 40 * DAY, "d")
    with store.dialect.transaction() as cur:
        cur.execute(
            "UPDATE journal SET record_key = 'contact:42', revision = 1 WHERE event_id = 'evt_1'"
        )
    prune(settings, store, store, None, now=time.time() - 10 * DAY)  # archives the old- rows
    backdate(store, "dead_letters", "status_at", 40 * DAY, "d")
    backdate(store, "dead_letters", "created_at", 40 * DAY, "d")
    client = redis.Redis.from_url(redis_url)
    for token in ("1", "2"):
        client.xadd(
            settings.keys.lease_log,
            {"event": "acquired", "shard": "1", "worker": "w", "token": token},
        )
    client.close()
    # When each command runs as written
    for command, expected in commands:
        ran = keylane(settings, *shlex.split(command)[1:])
        assert ran.returncode == 0, command + ran.stderr
        progress = [line for line in ran.stderr.splitlines() if line.endswith(" archived")]
        output = progress + ran.stdout.splitlines()
        # Then it prints what the page shows, numbers, times and file names aside
        assert [shape(line) for line in output] == [shape(line) for line in expected], command


@pytest.mark.slow
def test_keylane_up_s_scheduler_runs_the_prune_as_a_job_of_its_own(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a store with events past their retention, and a scheduler that runs the prune
    # every second (KEYLANE_PRUNE_EVERY_S)
    stack.settings = with_sources(
        stack.settings, tmp_path, dedupe_retention_s=1, journal_margin_s=0
    )
    store = stack.open_store()
    store.migrate()
    seed(store, 300, "old")
    time.sleep(1.5)  # past the source's retention of 1 s (set by the test, not waited on)
    stack._spawn("scheduler", ["scheduler"], prune_every_s=1)
    # When it has run a tick of keylane.journal-prune
    records = RetentionRecords.from_url(stack.settings.redis_dsn(), stack.settings.keys)
    try:
        wait_until(
            lambda: "last_prune_at" in records.figures(), 60, "a prune", on_timeout=stack.logs
        )
    finally:
        records.close()
    # Then the old rows left the table for the archive, and the job is listed as a schedule
    wait_until(lambda: store.journal_size() == 0, 60, "the old rows archived")
    listed = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "schedules", "--json"],
        env=settings_env(stack.settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "keylane.journal-prune" in listed.stdout, listed.stdout + listed.stderr


def test_a_prune_command_finds_no_store_creates_none_and_says_where_it_looked(
    settings: Settings, store_url: str
) -> None:
    # Given a deployment whose store was never created (no worker ran on it)
    # When `keylane journal prune` runs against it
    done = keylane(settings, "journal", "prune")
    # Then it exits 2 with one line saying where it looked, and created nothing there
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no keylane store at" in done.stderr or "has no keylane tables" in done.stderr
    if settings.store_is_sqlite:
        assert not Path(store_url.removeprefix("sqlite://")).exists()
        return
    never = open_store(store_url)
    try:
        assert not never.has_schema()
    finally:
        never.close()


def test_a_prune_with_an_archive_folder_it_cannot_make_is_one_line_exit_2(
    settings: Settings, store: SqlStore, tmp_path: Path
) -> None:
    # Given an archive folder under a file, another that is a file, and two that cannot be
    # made: under /proc (no such file or directory) and under /sys (not permitted, as on
    # a read-only file system, even for root)
    (tmp_path / "a-file").write_text("not a folder")
    unmakeable = [Path("/proc/keylane-archive"), Path("/sys/keylane-archive")]
    for archive in (tmp_path / "a-file", tmp_path / "a-file" / "archive", *unmakeable):
        # When a prune runs with it
        done = keylane(settings, "journal", "prune", archive_dir=archive)
        # Then it exits 2 with one line naming the folder and the setting, no traceback
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"the archive directory {archive}" in done.stderr
        assert "KEYLANE_ARCHIVE_DIR" in done.stderr
