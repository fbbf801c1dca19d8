"""Retention in the store (workers/stores/retention.py), on SQLite and PostgreSQL alike:
which rows are due, the delete that follows the archive and may be repeated after a
crash, the archived ids that still refuse a replay, and one prune at a time."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from keylane.routing.contract.errors import AlreadyApplied
from keylane.workers.store import RecordStore, RetentionStore
from keylane.workers.store_rows import Commit, DeadLetterFilter
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from keylane.workers.stores.sql_retention import remove_archived
from tests.test_store import _someone_waits_on, draft, is_postgres, write


def later() -> float:
    """A cutoff after everything written so far (and before anything written next)."""
    time.sleep(0.01)
    cutoff = time.time()
    time.sleep(0.01)
    return cutoff


def applied(
    store: RecordStore, *event_ids: str, source: str = "crm", key: str = "contact:1"
) -> None:
    """Apply one increment per event id to ``key``."""
    for event_id in event_ids:
        record = store.read(key)
        n = record.fields.get("n", 0) + 1
        store.commit_event(write(event_id, key, {"n": n}, record.revision, source=source), None)


def test_journal_rows_are_due_by_source_once_recorded_before_the_cutoff(store: SqlStore) -> None:
    # Given two events of crm, then (after the cutoff) one of crm and one of forms
    applied(store, "e1", "e2")
    cutoff = later()
    applied(store, "e3")
    applied(store, "f1", source="forms", key="lead:1")
    # When the rows due before the cutoff are read
    rows = store.old_rows("journal", cutoff, 100, "crm")
    # Then they are crm's two first, oldest first, whole
    assert [r["event_id"] for r in rows] == ["e1", "e2"]
    assert rows[0]["record_key"] == "contact:1"
    assert rows[0]["outcome"] == "applied"
    assert store.count_old_rows("journal", cutoff, "crm") == 2
    assert store.old_rows("journal", cutoff, 100, "forms") == []
    assert store.journal_sources() == ["crm", "forms"]
    # And a limit is honoured
    assert [r["event_id"] for r in store.old_rows("journal", cutoff, 1, "crm")] == ["e1"]


def test_archived_rows_leave_the_journal_and_their_ids_are_remembered(store: SqlStore) -> None:
    # Given two old events and a new one
    applied(store, "e1", "e2")
    cutoff = later()
    applied(store, "e3")
    rows = store.old_rows("journal", cutoff, 100, "crm")
    # When they are removed as archived
    gone = store.remove_archived("journal", rows).archived
    # Then both left, the new one stayed, and their ids read as archived
    assert gone == rows
    assert [e.event_id for e in store.journal_entries()] == ["e3"]
    entry = store.journal("crm", "e1")
    assert entry is not None
    assert entry.outcome == "archived"
    assert int(entry.recorded_at) == int(rows[0]["recorded_at"])
    ages = store.table_ages()
    assert ages["journal"].rows == 1
    assert ages["archived_ids"].rows == 2


def test_a_replay_of_an_archived_event_is_refused_and_writes_nothing(store: SqlStore) -> None:
    # Given an event whose journal row was archived
    applied(store, "e1")
    store.remove_archived("journal", store.old_rows("journal", later(), 100, "crm"))
    before = store.read("contact:1")
    # When it is delivered again, alone, in a batch, or as a dead letter
    replay = write("e1", "contact:1", {"n": 99}, before.revision)
    with pytest.raises(AlreadyApplied) as refused:
        store.commit_event(replay, None)
    assert refused.value.outcome == "archived"
    fresh = write("e2", "contact:1", {"n": 98}, before.revision)
    with pytest.raises(AlreadyApplied):
        store.commit_events([fresh, replay], None)
    with pytest.raises(AlreadyApplied):
        store.commit_dead_letter(draft("e1"), None)
    # Then nothing was written: no record change, no journal row, no review row
    assert store.read("contact:1") == before
    assert store.journal_entries() == []
    assert store.dead_letters(DeadLetterFilter()) == []


def test_removing_the_same_rows_again_deletes_nothing_else(store: SqlStore) -> None:
    # Given rows removed once (a prune killed before it renamed its file runs again)
    applied(store, "e1", "e2")
    rows = store.old_rows("journal", later(), 100, "crm")
    store.remove_archived("journal", rows)
    applied(store, "e3")
    # When the same rows are removed again
    again = store.remove_archived("journal", rows).archived
    # Then they still count as archived (they are gone), and nothing else changed
    assert again == rows
    assert [e.event_id for e in store.journal_entries()] == ["e3"]
    assert store.table_ages()["archived_ids"].rows == 2


def test_a_row_that_changed_after_it_was_read_stays_and_is_left_out(store: SqlStore) -> None:
    # Given a dead-lettered event whose review row was retried, and an applied one
    applied(store, "e1")
    row_id = store.commit_dead_letter(draft("d1"), None)
    assert store.set_dead_letter_status(row_id, "retried", ("open",), "ada")
    rows = store.old_rows("journal", later(), 100, "crm")
    assert {r["event_id"] for r in rows} == {"e1", "d1"}
    # When the retry applies (its journal row changes) before the archived rows go
    record = store.read("contact:1")
    store.commit_event(write("d1", "contact:1", {"n": 5}, record.revision, retry_of=row_id), None)
    gone = store.remove_archived("journal", rows).archived
    # Then only the unchanged row left; the retried one stays, applied
    assert [r["event_id"] for r in gone] == ["e1"]
    entry = store.journal("crm", "d1")
    assert entry is not None
    assert entry.outcome == "applied"


def test_a_dead_lettered_event_keeps_its_row_while_a_person_may_retry_it(store: SqlStore) -> None:
    # Given an event dead-lettered long ago whose review row is open
    row_id = store.commit_dead_letter(draft("d1"), None)
    # Then its journal row is not due, however old
    assert store.old_rows("journal", later(), 100, "crm") == []
    # When the row is discarded: due only once the cutoff passes the closing
    before_closing = later()
    assert store.set_dead_letter_status(row_id, "discarded", ("open",), "ada")
    assert store.count_old_rows("journal", before_closing, "crm") == 0
    assert [r["event_id"] for r in store.old_rows("journal", later(), 100, "crm")] == ["d1"]


def test_closed_dead_letters_are_due_after_closing_and_open_ones_never(store: SqlStore) -> None:
    # Given an open review row and a resolved one
    open_id = store.commit_dead_letter(draft("d1"), None)
    closed_id = store.commit_dead_letter(draft("d2"), None)
    assert store.set_dead_letter_status(closed_id, "resolved", ("open",), "ada", "done")
    cutoff = later()
    # When the due review rows are read and removed
    rows = store.old_rows("dead_letters", cutoff, 100)
    assert [r["id"] for r in rows] == [closed_id]
    assert rows[0]["event"]["id"] == "d2"
    assert rows[0]["note"] == "done"
    assert store.remove_archived("dead_letters", rows).archived == rows
    # Then the resolved row is gone and the open one stays
    assert store.dead_letter(closed_id) is None
    assert store.dead_letter(open_id) is not None
    assert store.table_ages()["dead_letters"].rows == 0  # closed rows


def test_a_dead_letter_closed_again_after_it_was_read_stays(store: SqlStore) -> None:
    # Given a resolved row read for the archive
    row_id = store.commit_dead_letter(draft("d1"), None)
    store.set_dead_letter_status(row_id, "resolved", ("open",), "ada")
    rows = store.old_rows("dead_letters", later(), 100)
    # When someone changes it meanwhile (its status time moves)
    store.set_dead_letter_status(row_id, "discarded", ("resolved",), "bob")
    # Then removing the archived copy leaves it in place
    assert store.remove_archived("dead_letters", rows).archived == []
    row = store.dead_letter(row_id)
    assert row is not None
    assert row.status == "discarded"


def test_forgotten_archived_ids_make_a_replay_a_new_event(store: SqlStore) -> None:
    # Given an archived event
    applied(store, "e1")
    store.remove_archived("journal", store.old_rows("journal", later(), 100, "crm"))
    # When archived ids recorded before now are forgotten
    assert store.forget_archived_ids(later(), 100).forgotten == 1
    # Then a replay applies as a new event
    record = store.read("contact:1")
    store.commit_event(write("e1", "contact:1", {"n": 2}, record.revision), None)
    assert store.read("contact:1").fields == {"n": 2}
    assert store.forget_archived_ids(later(), 100).forgotten == 0


def test_table_ages_give_rows_and_the_oldest_of_each(store: SqlStore) -> None:
    # Given an empty store, then three events of two sources
    assert store.table_ages()["journal"].rows == 0
    assert store.table_ages()["journal"].oldest is None
    applied(store, "e1")
    applied(store, "f1", source="forms", key="lead:1")
    applied(store, "e2")
    # Then the journal counts them and its oldest is the first
    ages = store.table_ages()
    assert ages["journal"].rows == 3
    first = store.journal("crm", "e1")
    assert first is not None
    assert ages["journal"].oldest == first.recorded_at


def test_find_journal_by_event_id_in_any_source_or_by_record(store: SqlStore) -> None:
    # Given one event id used by two sources, and a record with two events
    applied(store, "e1", "e2")
    applied(store, "e1", source="forms", key="lead:1")
    # Then each way of asking finds its rows
    assert {e.source for e in store.find_journal("e1")} == {"crm", "forms"}
    assert [e.source for e in store.find_journal("e1", source="forms")] == ["forms"]
    assert [e.event_id for e in store.find_journal(record_key="contact:1")] == ["e1", "e2"]
    assert store.find_journal("nope") == []


def test_one_process_at_a_time_holds_the_maintenance_lock(
    store: RetentionStore, store_url: str
) -> None:
    # Given another connection to the same store
    other = open_store(store_url)
    try:
        with store.maintenance_lock() as mine:
            # Then while one holds the lock the other cannot take it
            assert mine
            with other.maintenance_lock() as theirs:
                assert not theirs
        # And once released, it can
        with other.maintenance_lock() as theirs:
            assert theirs
    finally:
        other.close()


def test_an_archiving_that_commits_while_a_replay_waits_refuses_the_replay(
    store: SqlStore, store_url: str
) -> None:
    # Given an old event, and a prune's delete of it written but not yet committed
    applied(store, "e1")
    rows = store.old_rows("journal", later(), 100, "crm")
    outcome: list[str] = []

    def lane() -> None:
        own = open_store(store_url, timeout_ms=30_000)
        try:
            record = own.read("contact:1")
            own.commit_event(write("e1", "contact:1", {"n": 9}, record.revision), None)
            outcome.append("applied")
        except AlreadyApplied as exc:
            outcome.append(exc.outcome)
        finally:
            own.close()

    pruner = open_store(store_url)
    thread = threading.Thread(target=lane)
    try:
        with pruner.dialect.transaction() as cur:
            remove_archived(pruner.dialect, cur, "journal", rows)
            # When the event is replayed (and waits on the row being deleted)
            thread.start()
            deadline = time.monotonic() + 20
            while not _waits(cur, store_url):
                assert time.monotonic() < deadline, "the replay never waited on the delete"
                time.sleep(0.02)
            # And the archiving commits
    finally:
        thread.join(30)
        pruner.close()
    # Then the replay is refused, and the record is as the event left it
    assert outcome == ["archived"]
    assert store.read("contact:1").fields == {"n": 1}
    assert store.journal_entries() == []


def _waits(cur: Any, store_url: str) -> bool:
    if not is_postgres(store_url):
        return _someone_waits_on(None, store_url)
    cur.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted "
        "AND transactionid::text = (txid_current() % 4294967296)::text"
    )
    return bool(cur.fetchone()[0])


def test_the_space_of_removed_rows_is_reclaimed(store: SqlStore, store_url: str) -> None:
    # Given 3,000 journal rows of which 2,000 were archived
    journal_only = [write(f"e{i}", "contact:1", {}, 0) for i in range(3000)]
    store.commit_group([Commit((replace(w, fields=None),), None) for w in journal_only])
    rows = store.old_rows("journal", later(), 2000, "crm")
    store.remove_archived("journal", rows)
    if not is_postgres(store_url):
        # Then on SQLite nothing is to be done: it reuses the pages it freed
        assert store.reclaim_space() == []
        return
    # Then on PostgreSQL the journal is vacuumed (once its dead rows reach the statistics)
    deadline = time.monotonic() + 30
    while "journal" not in store.reclaim_space():
        assert time.monotonic() < deadline, "the journal was never vacuumed"
        time.sleep(0.5)
    # And not again while no more rows died
    assert "journal" not in store.reclaim_space()
