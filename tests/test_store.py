"""The record store's promises (workers/store.py), checked against SQLite and
PostgreSQL alike: store-assigned revisions, an atomic journal, fences, review rows."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keylane.routing.contract.errors import AlreadyApplied, NotOwner, StaleFence, VersionConflict
from keylane.routing.contract.events import Change
from keylane.workers.changes import apply_changes
from keylane.workers.store import DeadLetterStore, FenceStore, RecordStore
from keylane.workers.store_rows import Commit, DeadLetterDraft, DeadLetterFilter, EventWrite, Fence
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore

SHARD = 3


def write(
    event_id: str,
    record_key: str,
    fields: dict[str, Any],
    expected: int,
    source: str = "crm",
    attempts: int = 1,
    retry_of: int | None = None,
) -> EventWrite:
    """An event's effect on one record."""
    return EventWrite(
        source=source,
        event_id=event_id,
        record_key=record_key,
        shard=SHARD,
        fields=fields,
        expected_revision=expected,
        attempts=attempts,
        retry_of=retry_of,
    )


def draft(
    event_id: str,
    record_key: str = "contact:1",
    reason: str = "conflict",
    source: str = "crm",
    retry_of: int | None = None,
) -> DeadLetterDraft:
    """A review row for an event that did not apply."""
    return DeadLetterDraft(
        source=source,
        event_id=event_id,
        record_key=record_key,
        shard=SHARD,
        reason=reason,
        event={"id": event_id, "record_key": record_key, "changes": {"n": {"increment": 1}}},
        attempted_change={"n": {"increment": 1}},
        revision_read=4,
        revision_found=5,
        attempts=3,
        error="revision moved from 4 to 5 on each of 3 attempts",
        retry_of=retry_of,
    )


def is_postgres(store_url: str) -> bool:
    return store_url.startswith("postgres")


@contextlib.contextmanager
def raw_sql(store_url: str) -> Iterator[Any]:
    """A plain driver connection to the test's store, for setting up what the API cannot
    (a backdated row, a transaction held open). Closed after."""
    if is_postgres(store_url):
        with psycopg.connect(store_url, autocommit=True) as conn:
            yield conn
    else:
        lite = sqlite3.connect(store_url[len("sqlite://") :], isolation_level=None)
        try:
            yield lite
        finally:
            lite.close()


def query(store_url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) on a fresh connection; the rows, if any."""
    if is_postgres(store_url):
        sql = sql.replace("?", "%s")
    with raw_sql(store_url) as conn:
        cur = conn.execute(sql, params)
        rows = cur.fetchall() if cur.description else []
        cur.close()
    return [tuple(r) for r in rows]


# -- records and revisions ---------------------------------------------------------------


def test_an_absent_record_reads_as_revision_zero(store: RecordStore) -> None:
    # Given an empty store, When a record is read
    record = store.read("contact:1")
    # Then it has no fields, revision 0, and does not exist
    assert record.key == "contact:1"
    assert record.fields == {}
    assert record.revision == 0
    assert record.updated_at is None
    assert not record.exists


def test_the_first_write_creates_revision_one_and_each_write_adds_one(store: RecordStore) -> None:
    # Given an empty store
    before = time.time()
    # When an event creates a record, and another changes it
    first = store.commit_event(write("e1", "contact:1", {"n": 1}, expected=0), None)
    second = store.commit_event(write("e2", "contact:1", {"n": 2}, expected=1), None)
    # Then the store gave revisions 1 and 2, and the record reads as last written
    assert (first, second) == (1, 2)
    record = store.read("contact:1")
    assert record.exists
    assert record.fields == {"n": 2}
    assert record.revision == 2
    assert record.updated_at is not None
    assert before - 1 <= record.updated_at <= time.time() + 1


def test_a_stale_write_is_a_conflict_that_writes_nothing(store: SqlStore) -> None:
    # Given a record at revision 2
    store.commit_event(write("e1", "contact:1", {"n": 1}, expected=0), None)
    store.write_outside("contact:1", {"n": 1, "note": "edited"}, expected_revision=1)
    # When an event written against revision 1 is committed
    with pytest.raises(VersionConflict) as caught:
        store.commit_event(write("e2", "contact:1", {"n": 99}, expected=1), None)
    # Then the conflict names the revision read and the revision found
    assert (caught.value.record_key, caught.value.expected, caught.value.found) == (
        "contact:1",
        1,
        2,
    )
    # And nothing was written: not the record, not the journal
    assert store.read("contact:1").fields == {"n": 1, "note": "edited"}
    assert store.read("contact:1").revision == 2
    assert store.journal("crm", "e2") is None
    assert store.journal_size() == 1


def test_creating_a_record_that_exists_is_a_conflict(store: RecordStore) -> None:
    # Given a record at revision 1
    store.commit_event(write("e1", "contact:1", {"n": 1}, expected=0), None)
    # When another writer also believes it is absent, Then it conflicts with revision 1
    with pytest.raises(VersionConflict) as caught:
        store.commit_event(write("e2", "contact:1", {"n": 2}, expected=0), None)
    assert caught.value.found == 1
    assert store.read("contact:1").fields == {"n": 1}


def test_updating_a_record_that_does_not_exist_is_a_conflict(store: SqlStore) -> None:
    # Given no record, When a write expects revision 3, Then it conflicts with 0
    with pytest.raises(VersionConflict) as caught:
        store.commit_event(write("e1", "contact:9", {"n": 1}, expected=3), None)
    assert caught.value.found == 0
    # And the record was not created
    assert not store.read("contact:9").exists
    assert store.journal_size() == 0


def test_an_outside_write_bumps_the_revision_without_a_journal_entry(store: SqlStore) -> None:
    # Given an empty store
    # When a person creates a record, edits it, then edits it again from a stale read
    assert store.write_outside("contact:1", {"email": "a@b.c"}, 0) == 1
    assert store.write_outside("contact:1", {"email": "x@y.z"}, 1) == 2
    with pytest.raises(VersionConflict) as caught:
        store.write_outside("contact:1", {"email": "stale"}, 1)
    # Then the stale edit failed, the others bumped the revision, and no event was journaled
    assert caught.value.found == 2
    assert store.read("contact:1").fields == {"email": "x@y.z"}
    assert store.read("contact:1").revision == 2
    assert store.journal_size() == 0


# -- the journal -------------------------------------------------------------------------


def test_an_event_and_its_journal_entry_are_written_together(store: SqlStore) -> None:
    # Given a store whose shard fence is at 7
    store.advance_fence(SHARD, 7)
    before = time.time()
    # When an event is committed on its third attempt
    revision = store.commit_event(
        write("evt-1", "contact:1", {"visits": 3}, expected=0, attempts=3), Fence(SHARD, 7)
    )
    # Then the record and the journal entry both say so
    assert store.read("contact:1").fields == {"visits": 3}
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert (entry.source, entry.event_id, entry.record_key, entry.shard) == (
        "crm",
        "evt-1",
        "contact:1",
        SHARD,
    )
    assert entry.outcome == "applied"
    assert entry.revision == revision == 1
    assert entry.attempts == 3
    assert entry.fence == 7
    assert before - 1 <= entry.recorded_at <= time.time() + 1
    assert store.journal_size() == 1


def test_a_second_commit_of_an_event_is_already_applied_and_changes_nothing(
    store: SqlStore,
) -> None:
    # Given an event applied to a record (revision 1)
    store.commit_event(write("evt-1", "contact:1", {"n": 1}, expected=0), None)
    entry = store.journal("crm", "evt-1")
    # When it is committed again, against the current revision, even with other fields
    # or about another record
    for again in (
        write("evt-1", "contact:1", {"n": 2}, expected=1),
        write("evt-1", "contact:2", {"n": 2}, expected=0),
    ):
        with pytest.raises(AlreadyApplied) as caught:
            store.commit_event(again, None)
        # Then it is refused as applied
        assert (caught.value.source, caught.value.event_id, caught.value.outcome) == (
            "crm",
            "evt-1",
            "applied",
        )
    # And nothing changed: the record, the other record, the journal
    assert store.read("contact:1").fields == {"n": 1}
    assert store.read("contact:1").revision == 1
    assert not store.read("contact:2").exists
    assert store.journal("crm", "evt-1") == entry
    assert store.journal_size() == 1


def test_event_ids_are_per_source(store: SqlStore) -> None:
    # Given an event id applied for one source
    store.commit_event(write("evt-1", "contact:1", {"n": 1}, expected=0, source="crm"), None)
    # When another source sends the same id, Then it is a different event and applies
    assert store.commit_event(write("evt-1", "contact:1", {"n": 2}, 1, source="billing"), None) == 2
    assert store.journal("billing", "evt-1") is not None
    assert store.journal_size() == 2


def test_a_conflicting_commit_leaves_no_journal_entry_so_the_retry_applies(store: SqlStore) -> None:
    # Given a record at revision 1 and an event that read it at revision 0
    store.write_outside("contact:1", {"n": 10}, 0)
    with pytest.raises(VersionConflict):
        store.commit_event(write("evt-1", "contact:1", {"n": 1}, expected=0), None)
    # When the event is re-applied to a fresh read
    revision = store.commit_event(write("evt-1", "contact:1", {"n": 11}, expected=1), None)
    # Then it applies once, journaled with the revision it made
    assert revision == 2
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert entry.revision == 2


def test_an_operators_retry_of_a_dead_lettered_event_applies_once(store: SqlStore) -> None:
    # Given an event that was dead-lettered (its journal entry is closed)
    row = store.commit_dead_letter(draft("evt-1"), None)
    store.write_outside("contact:1", {"n": 1}, 0)
    # When the original delivery comes again, Then it is already (dead-)lettered
    with pytest.raises(AlreadyApplied) as caught:
        store.commit_event(write("evt-1", "contact:1", {"n": 2}, expected=1), None)
    assert caught.value.outcome == "dead_lettered"
    # When an operator retries it
    revision = store.commit_event(
        write("evt-1", "contact:1", {"n": 2}, expected=1, attempts=1, retry_of=row), None
    )
    # Then it applies, and the journal now says applied with the revision made
    assert revision == 2
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert (entry.outcome, entry.revision) == ("applied", 2)
    # When the retry is retried (or the original is delivered again)
    for again in (
        write("evt-1", "contact:1", {"n": 3}, expected=2, retry_of=row),
        write("evt-1", "contact:1", {"n": 3}, expected=2),
    ):
        with pytest.raises(AlreadyApplied) as caught:
            store.commit_event(again, None)
        assert caught.value.outcome == "applied"
    # Then it had no second effect
    assert store.read("contact:1").fields == {"n": 2}
    assert store.read("contact:1").revision == 2
    assert store.journal_size() == 1


def test_a_retry_that_conflicts_leaves_the_event_dead_lettered(store: SqlStore) -> None:
    # Given a dead-lettered event and a record at revision 1
    row = store.commit_dead_letter(draft("evt-1"), None)
    store.write_outside("contact:1", {"n": 1}, 0)
    # When its retry is written against a stale revision
    with pytest.raises(VersionConflict):
        store.commit_event(write("evt-1", "contact:1", {"n": 2}, expected=0, retry_of=row), None)
    # Then the journal still says dead-lettered, so a later retry may still apply it
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert entry.outcome == "dead_lettered"
    assert store.commit_event(write("evt-1", "contact:1", {"n": 2}, 1, retry_of=row), None) == 2


def test_journal_entries_list_by_record_then_revision(store: SqlStore) -> None:
    # Given events on two records, one dead-lettered
    store.commit_event(write("b1", "contact:b", {"n": 1}, 0), None)
    store.commit_event(write("a1", "contact:a", {"n": 1}, 0), None)
    store.commit_event(write("a2", "contact:a", {"n": 2}, 1), None)
    store.commit_dead_letter(draft("a3", "contact:a"), None)
    # When the journal is listed, all or by record
    every = [(e.record_key, e.event_id, e.revision) for e in store.journal_entries()]
    only_a = [e.event_id for e in store.journal_entries("contact:a")]
    # Then entries come by record key, then revision, and the filter keeps one record
    assert {e[1] for e in every} == {"a1", "a2", "a3", "b1"}
    assert [e[0] for e in every] == ["contact:a"] * 3 + ["contact:b"]
    assert [e for e in every if e[2] is not None][:2] == [
        ("contact:a", "a1", 1),
        ("contact:a", "a2", 2),
    ]
    assert sorted(only_a) == ["a1", "a2", "a3"]
    assert store.journal_entries("contact:none") == []


# -- fences ------------------------------------------------------------------------------


def test_a_batch_writes_its_record_once_with_a_journal_entry_per_event(store: SqlStore) -> None:
    # Given a record at revision 1
    store.commit_event(write("e0", "contact:1", {"n": 0}, expected=0), None)
    # When three events of it are committed together, each write holding the fields as
    # they stand after that event
    batch = [write(f"e{i}", "contact:1", {"n": i}, expected=1) for i in (1, 2, 3)]
    revision = store.commit_events(batch, None)
    # Then the record was written once, with the last fields, and each event is journaled
    assert revision == 2
    assert store.read("contact:1").fields == {"n": 3}
    for i in (1, 2, 3):
        entry = store.journal("crm", f"e{i}")
        assert entry is not None
        assert (entry.outcome, entry.revision) == ("applied", 2)
    # And a batch holding one event that already has an outcome leaves nothing written
    again = [write("e4", "contact:1", {"n": 4}, expected=2), write("e2", "contact:1", {}, 2)]
    with pytest.raises(AlreadyApplied):
        store.commit_events(again, None)
    assert store.read("contact:1").revision == 2
    assert store.journal("crm", "e4") is None


def test_a_group_commit_refuses_each_commit_on_its_own(store: SqlStore) -> None:
    # Given two records, and a newer owner's fence on another shard
    store.commit_event(write("a0", "contact:a", {"n": 0}, expected=0), None)
    store.commit_event(write("b0", "contact:b", {"n": 0}, expected=0), None)
    store.advance_fence(SHARD + 1, 9)
    # When four lanes' commits go in one group: one good, one stale revision, one
    # duplicate event id, one under an old fence, and another good one
    commits = [
        Commit((write("a1", "contact:a", {"n": 1}, expected=1),), Fence(SHARD, 1)),
        Commit((write("b1", "contact:b", {"n": 1}, expected=0),), None),
        Commit((write("a0", "contact:c", {"n": 1}, expected=0),), None),
        Commit(
            (replace(write("d1", "contact:d", {"n": 1}, 0), shard=SHARD + 1),), Fence(SHARD + 1, 3)
        ),
        Commit((write("b2", "contact:b", {"n": 2}, expected=1),), None),
    ]
    results = store.commit_group(commits)
    # Then each got its own answer, and only the good ones are written
    assert results[0] == 2
    assert isinstance(results[1], VersionConflict)
    assert isinstance(results[2], AlreadyApplied)
    assert isinstance(results[3], StaleFence)
    assert results[4] == 2
    assert store.read("contact:a").fields == {"n": 1}
    assert store.read("contact:b").fields == {"n": 2}
    assert not store.read("contact:c").exists
    assert not store.read("contact:d").exists
    assert store.journal("crm", "b1") is None
    assert store.journal("crm", "d1") is None
    assert store.journal_size() == 4  # a0, b0, a1, b2


def test_advance_fence_keeps_the_newest_token_per_shard(store: FenceStore) -> None:
    # Given no fences, Then every shard is at 0
    assert store.fence_of(SHARD) == 0
    # When tokens arrive out of order, Then each call returns the newest seen
    assert store.advance_fence(SHARD, 5) == 5
    assert store.advance_fence(SHARD, 2) == 5
    assert store.advance_fence(SHARD, 5) == 5
    assert store.advance_fence(SHARD, 9) == 9
    # And shards are independent
    assert store.fence_of(SHARD) == 9
    assert store.fence_of(SHARD + 1) == 0
    assert store.advance_fence(SHARD + 1, 1) == 1


def test_fences_reads_every_fenced_shards_newest_token_at_once(store: FenceStore) -> None:
    # Given no fences, Then none is read
    assert store.fences() == {}
    # When two shards are fenced, one of them twice (once by a claim)
    store.advance_fence(SHARD, 4)
    store.advance_fence(SHARD + 2, 1)
    store.claim_fence(SHARD)
    # Then each reads as its newest token, as fence_of reads it, and no other shard shows
    assert store.fences() == {SHARD: 5, SHARD + 2: 1}
    assert store.fence_of(SHARD) == 5


def test_claim_fence_gives_each_claim_a_newer_token_and_fences_the_older(store: SqlStore) -> None:
    # Given a shard whose fence a lease-based broker advanced to 4
    store.advance_fence(SHARD, 4)
    # When two consumers claim it in turn (a broker with no counter of its own)
    first, second = store.claim_fence(SHARD), store.claim_fence(SHARD)
    # Then each got its own token past the newest, and an unknown shard starts at 1
    assert (first, second) == (5, 6)
    assert store.claim_fence(SHARD + 1) == 1
    # And the first claim's write is refused, as any older owner's
    with pytest.raises(StaleFence):
        store.commit_event(write("claim-1", "contact:1", {"n": 1}, 0), Fence(SHARD, first))


def test_parked_messages_keep_their_order_and_their_owners_fence(store: SqlStore) -> None:
    # Given a shard's current consumer (token 3) parking a record's waiting messages twice
    store.advance_fence(SHARD, 3)
    store.park(SHARD, "contact:1", [(b"m1", 1), (b"m2\x00\xff", 0)], 100.0, Fence(SHARD, 3))
    store.park(SHARD, "contact:1", [(b"m3", 0)], 200.0, Fence(SHARD, 3))
    store.park(SHARD, "contact:2", [(b"n1", 2)], 50.0, Fence(SHARD, 3))
    # Then they come back in order, bytes as they were, due at the last time given
    rows = store.parked(SHARD, "contact:1")
    assert [(r.seq, r.raw, r.deliveries, r.due_at) for r in rows] == [
        (1, b"m1", 1, 200.0),
        (2, b"m2\x00\xff", 0, 200.0),
        (3, b"m3", 0, 200.0),
    ]
    assert {r.record_key for r in store.parked(SHARD)} == {"contact:1", "contact:2"}
    assert [store.parked_count(SHARD, k) for k in ("contact:1", "contact:2", "x")] == [3, 1, 0]
    # When a delivery is counted, and the first two are done with
    store.count_parked(SHARD, "contact:1", 1)
    assert store.parked(SHARD, "contact:1")[0].deliveries == 2
    assert store.unpark(SHARD, "contact:1", [1, 2], Fence(SHARD, 3)) == 1
    # Then an older owner can neither park nor unpark
    store.advance_fence(SHARD, 4)
    with pytest.raises(StaleFence):
        store.park(SHARD, "contact:1", [(b"late", 0)], 1.0, Fence(SHARD, 3))
    with pytest.raises(StaleFence):
        store.unpark(SHARD, "contact:1", [3], Fence(SHARD, 3))
    assert [r.raw for r in store.parked(SHARD, "contact:1")] == [b"m3"]


def test_a_held_record_is_released_by_its_row_only_and_a_retry_goes_ahead(
    store: SqlStore,
) -> None:
    # Given a shard's current consumer (token 3), a record's open dead letter and two
    # messages parked behind it
    store.advance_fence(SHARD, 3)
    row_id = store.commit_dead_letter(draft("h-1"), Fence(SHARD, 3))
    other = store.commit_dead_letter(draft("h-2"), Fence(SHARD, 3))
    store.park(SHARD, "contact:1", [(b"m1", 0), (b"m2", 1)], 100.0, Fence(SHARD, 3))
    # When the record is held behind the row, Then it is held by it, and by it only
    assert store.hold(SHARD, "contact:1", row_id, Fence(SHARD, 3)) == row_id
    assert store.hold(SHARD, "contact:1", other, Fence(SHARD, 3)) == row_id
    assert store.held(SHARD) == {"contact:1": row_id}
    assert store.held(SHARD, "contact:2") == {}
    # And another row's release does nothing
    assert not store.release(SHARD, "contact:1", other, 5.0, Fence(SHARD, 3))
    # When an older owner tries, Then it is refused and changes nothing
    store.advance_fence(SHARD, 4)
    with pytest.raises(StaleFence):
        store.release(SHARD, "contact:1", row_id, 5.0, Fence(SHARD, 3))
    with pytest.raises(StaleFence):
        store.hold(SHARD, "contact:2", other, Fence(SHARD, 3))
    assert store.held(SHARD) == {"contact:1": row_id}
    # When the row's retry releases it, Then the retry goes first, the parked ones
    # after it in their order, all due at the time given
    retry = (b"retry", 0)
    assert store.release(SHARD, "contact:1", row_id, 7.0, Fence(SHARD, 4), first=retry)
    rows = store.parked(SHARD, "contact:1")
    assert [(r.seq, r.raw, r.deliveries, r.due_at) for r in rows] == [
        (1, b"retry", 0, 7.0),
        (2, b"m1", 0, 7.0),
        (3, b"m2", 1, 7.0),
    ]
    assert store.held(SHARD) == {}
    assert not store.release(SHARD, "contact:1", row_id, 8.0, Fence(SHARD, 4))
    # And a row closed before its hold came holds nothing
    assert store.set_dead_letter_status(other, "discarded", ("open",), "op", None)
    assert store.hold(SHARD, "contact:2", other, Fence(SHARD, 4)) is None
    assert store.held(SHARD) == {}


def test_a_write_with_an_older_token_is_refused_and_writes_nothing(store: SqlStore) -> None:
    # Given a shard whose fence was advanced to 7 by a new owner
    store.advance_fence(SHARD, 7)
    # When the old owner (token 6) commits an event, a dead letter, and a bare review row
    with pytest.raises(StaleFence) as caught:
        store.commit_event(write("e1", "contact:1", {"n": 1}, 0), Fence(SHARD, 6))
    with pytest.raises(StaleFence):
        store.commit_dead_letter(draft("e2"), Fence(SHARD, 6))
    with pytest.raises(StaleFence):
        store.commit_dead_letter(draft("e3"), Fence(SHARD, 6), close_event=False)
    # Then each is refused as lost ownership, naming both tokens
    assert isinstance(caught.value, NotOwner)
    assert (caught.value.shard, caught.value.token, caught.value.current) == (SHARD, 6, 7)
    # And nothing at all was written
    assert not store.read("contact:1").exists
    assert store.journal_size() == 0
    assert store.dead_letters(DeadLetterFilter()) == []
    assert store.fence_of(SHARD) == 7


def test_a_write_with_the_current_or_a_newer_token_is_accepted(store: SqlStore) -> None:
    # Given a shard fenced at 7
    store.advance_fence(SHARD, 7)
    # When the owner writes with 7, and a newer owner writes with 9 before advancing
    store.commit_event(write("e1", "contact:1", {"n": 1}, 0), Fence(SHARD, 7))
    store.commit_dead_letter(draft("e2"), Fence(SHARD, 9))
    # Then both are written, and the newer token became the shard's fence
    assert store.read("contact:1").revision == 1
    assert len(store.dead_letters(DeadLetterFilter())) == 1
    assert store.fence_of(SHARD) == 9
    # And the owner with 7 is now fenced off
    with pytest.raises(StaleFence):
        store.commit_event(write("e3", "contact:1", {"n": 2}, 1), Fence(SHARD, 7))


def test_a_fence_on_one_shard_does_not_stop_another(store: SqlStore) -> None:
    # Given shard 3 fenced at 7, When an owner of shard 4 writes with token 1, Then it writes
    store.advance_fence(SHARD, 7)
    store.commit_event(write("e1", "contact:1", {"n": 1}, 0), Fence(SHARD + 1, 1))
    assert store.read("contact:1").exists


# -- dead letters ------------------------------------------------------------------------


def test_a_dead_letter_keeps_everything_and_closes_its_event(store: SqlStore) -> None:
    # Given an event that could not be applied
    d = draft("evt-1", reason="type")
    before = time.time()
    # When it is dead-lettered under the current fence
    store.advance_fence(SHARD, 4)
    row_id = store.commit_dead_letter(d, Fence(SHARD, 4))
    # Then the review row holds every field of the draft, open
    row = store.dead_letter(row_id)
    assert row is not None
    assert row.id == row_id
    for name in DeadLetterDraft.__dataclass_fields__:
        assert getattr(row, name) == getattr(d, name), name
    assert row.status == "open"
    assert (row.status_by, row.status_at, row.note) == (None, None, None)
    assert before - 1 <= row.created_at <= time.time() + 1
    # And the event is closed in the journal as dead-lettered
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert (entry.outcome, entry.revision, entry.attempts, entry.fence) == (
        "dead_lettered",
        None,
        3,
        4,
    )
    # And a later delivery of the event has no effect
    with pytest.raises(AlreadyApplied) as caught:
        store.commit_event(write("evt-1", "contact:1", {"n": 1}, 0), Fence(SHARD, 4))
    assert caught.value.outcome == "dead_lettered"
    assert not store.read("contact:1").exists
    # And dead-lettering it again adds no second row
    with pytest.raises(AlreadyApplied):
        store.commit_dead_letter(d, Fence(SHARD, 4))
    assert [r.id for r in store.dead_letters(DeadLetterFilter())] == [row_id]


def test_an_applied_event_cannot_be_dead_lettered(store: SqlStore) -> None:
    # Given an applied event
    store.commit_event(write("evt-1", "contact:1", {"n": 1}, 0), None)
    # When it is dead-lettered, Then it is refused and no row is written
    with pytest.raises(AlreadyApplied) as caught:
        store.commit_dead_letter(draft("evt-1"), None)
    assert caught.value.outcome == "applied"
    assert store.dead_letters(DeadLetterFilter()) == []
    entry = store.journal("crm", "evt-1")
    assert entry is not None
    assert entry.outcome == "applied"


def test_a_review_row_without_closing_the_event_leaves_the_journal_alone(store: SqlStore) -> None:
    # Given an applied event, and an event never seen
    store.commit_event(write("evt-1", "contact:1", {"n": 1}, 0), None)
    applied = store.journal("crm", "evt-1")
    # When review rows are written for both without closing their events
    first = store.commit_dead_letter(draft("evt-1", reason="id_reused"), None, close_event=False)
    second = store.commit_dead_letter(draft("evt-2", reason="id_reused"), None, close_event=False)
    # Then both rows exist, the applied event is untouched and the new one is not journaled
    assert [r.id for r in store.dead_letters(DeadLetterFilter())] == [first, second]
    assert store.journal("crm", "evt-1") == applied
    assert store.journal("crm", "evt-2") is None
    # And the unseen event can still apply
    assert store.commit_event(write("evt-2", "contact:2", {"n": 1}, 0), None) == 1


def test_a_retry_that_is_dead_lettered_again_can_be_retried_again(store: SqlStore) -> None:
    # Given a dead-lettered event whose retry is dead-lettered too
    first = store.commit_dead_letter(draft("evt-1"), None)
    second = store.commit_dead_letter(draft("evt-1", retry_of=first), None)
    # Then both rows exist, the second pointing at the first
    rows = store.dead_letters(DeadLetterFilter())
    assert [(r.id, r.retry_of) for r in rows] == [(first, None), (second, first)]
    # And a retry of the second applies (once)
    store.commit_event(write("evt-1", "contact:1", {"n": 1}, 0, retry_of=second), None)
    with pytest.raises(AlreadyApplied):
        store.commit_event(write("evt-1", "contact:1", {"n": 1}, 1, retry_of=second), None)
    assert store.read("contact:1").revision == 1


def test_a_second_copy_of_a_retry_whose_failure_was_discarded_is_a_duplicate(
    store: SqlStore,
) -> None:
    # Given a dead-lettered event (row X) whose retry failed again (row Y), and the
    # operator discarded Y
    x = store.commit_dead_letter(draft("evt-1"), None)
    y = store.commit_dead_letter(draft("evt-1", retry_of=x), None)
    assert store.set_dead_letter_status(y, "discarded", ("open",), "op", None)
    # When a second copy of X's retry comes (a redelivery, or triage's retry published
    # twice), Then it is a duplicate: the operator threw that effect away
    with pytest.raises(AlreadyApplied) as caught:
        store.commit_event(write("evt-1", "contact:1", {"n": 1}, 0, retry_of=x), None)
    assert caught.value.outcome == "dead_lettered"
    assert store.read("contact:1").revision == 0
    # And a copy that fails again makes no new row either (the journal entry is closed)
    with pytest.raises(AlreadyApplied):
        store.commit_dead_letter(draft("evt-1", retry_of=x), None)
    assert [r.id for r in store.dead_letters(DeadLetterFilter())] == [x, y]


def test_a_hold_waits_for_a_close_in_progress_and_then_holds_nothing(
    store: SqlStore, store_url: str
) -> None:
    # Given a record's open dead letter, and an operator closing it in a transaction that
    # has not committed yet (PostgreSQL; SQLite has one writer at a time)
    if not is_postgres(store_url):
        pytest.skip("SQLite serialises the two writers")
    store.advance_fence(SHARD, 3)
    row_id = store.commit_dead_letter(draft("race-1"), Fence(SHARD, 3))
    with psycopg.connect(store_url) as closing:
        closing.execute(
            "UPDATE dead_letters SET status = 'discarded' WHERE id = %s AND status = 'open'",
            (row_id,),
        )
        # When the lane holds the record behind that row meanwhile
        held: list[int | None] = []
        lane = threading.Thread(
            target=lambda: held.append(store.hold(SHARD, "contact:1", row_id, Fence(SHARD, 3)))
        )
        lane.start()
        lane.join(2.0)  # (it waits for the close; without the row's lock it would not)
        closing.commit()
    lane.join(30)
    # Then the hold saw the row closed and held nothing (else the record would stay held
    # behind a closed row, with no release ever sent)
    assert held == [None]
    assert store.held(SHARD) == {}


def _backdate(store_url: str, row_id: int, age_s: float) -> None:
    query(
        store_url,
        "UPDATE dead_letters SET created_at = ? WHERE id = ?",
        (time.time() - age_s, row_id),
    )


def test_dead_letters_filter_by_status_reason_source_key_ids_age_and_limit(
    store: DeadLetterStore, store_url: str
) -> None:
    # Given review rows of several reasons, sources, keys and ages (oldest first)
    a = store.commit_dead_letter(draft("a", "contact:1", "conflict", "crm"), None)
    b = store.commit_dead_letter(draft("b", "contact:2", "type", "crm"), None)
    c = store.commit_dead_letter(draft("c", "contact:1", "type", "billing"), None)
    d = store.commit_dead_letter(draft("d", "deal:1", "not_owned", "billing"), None)
    _backdate(store_url, a, 3 * 86400)
    _backdate(store_url, b, 2 * 86400)
    _backdate(store_url, c, 3600)
    assert store.set_dead_letter_status(b, "discarded", ("open",), by="ops")

    def ids(**flt: Any) -> list[int]:
        return [r.id for r in store.dead_letters(DeadLetterFilter(**flt))]

    # When they are listed with each filter, Then exactly the matching rows come, in order
    assert ids() == [a, b, c, d]
    assert ids(statuses=("open",)) == [a, c, d]
    assert ids(statuses=("discarded", "resolved")) == [b]
    assert ids(reasons=("type",)) == [b, c]
    assert ids(reasons=("type", "not_owned")) == [b, c, d]
    assert ids(sources=("billing",)) == [c, d]
    assert ids(record_key="contact:1") == [a, c]
    assert ids(record_key="contact") == []
    assert ids(ids=(d, a, 10_000)) == [a, d]
    assert ids(limit=2) == [a, b]
    assert ids(limit=0) == []
    assert ids(older_than_s=86400) == [a, b]
    assert ids(newer_than_s=86400) == [c, d]
    assert ids(older_than_s=1800, newer_than_s=2.5 * 86400) == [b, c]
    # And filters combine
    assert ids(statuses=("open",), reasons=("type",), sources=("billing",)) == [c]
    assert ids(statuses=("open",), record_key="contact:1", limit=1) == [a]


def test_a_status_changes_only_from_an_allowed_status(store: DeadLetterStore) -> None:
    # Given an open review row
    row = store.commit_dead_letter(draft("evt-1"), None)
    # When it is retried from open, Then it moves, recording who, when and why
    before = time.time()
    assert store.set_dead_letter_status(row, "retried", ("open",), by="ana", note="fixed plan")
    got = store.dead_letter(row)
    assert got is not None
    assert (got.status, got.status_by, got.note) == ("retried", "ana", "fixed plan")
    assert got.status_at is not None
    assert before - 1 <= got.status_at <= time.time() + 1
    # When it is discarded as if still open, Then nothing changes
    assert not store.set_dead_letter_status(row, "discarded", ("open",), by="bob", note="x")
    got = store.dead_letter(row)
    assert got is not None
    assert (got.status, got.status_by, got.note) == ("retried", "ana", "fixed plan")
    # When it is resolved from retried without a note, Then the note is kept
    assert store.set_dead_letter_status(row, "resolved", ("retried", "open"), by="bob")
    got = store.dead_letter(row)
    assert got is not None
    assert (got.status, got.status_by, got.note) == ("resolved", "bob", "fixed plan")
    # And a row that does not exist changes nowhere
    assert not store.set_dead_letter_status(row + 100, "resolved", ("open",), by="bob")
    assert store.dead_letter(row + 100) is None


def test_a_status_change_allowed_from_no_status_changes_nothing(
    store: DeadLetterStore, store_url: str, request: pytest.FixtureRequest
) -> None:
    # Given an open review row
    row = store.commit_dead_letter(draft("evt-1"), None)
    # When a move is allowed from no status at all, Then it does not happen
    assert not store.set_dead_letter_status(row, "resolved", (), by="ana")
    got = store.dead_letter(row)
    assert got is not None
    assert got.status == "open"


def test_dead_letter_stats_count_by_status_reason_and_source(
    store: DeadLetterStore, store_url: str
) -> None:
    # Given rows of two reasons and sources, one discarded, one a day old
    a = store.commit_dead_letter(draft("a", reason="conflict", source="crm"), None)
    store.commit_dead_letter(draft("b", reason="conflict", source="crm"), None)
    c = store.commit_dead_letter(draft("c", reason="type", source="crm"), None)
    store.commit_dead_letter(draft("d", reason="conflict", source="billing"), None)
    _backdate(store_url, a, 86400)
    store.set_dead_letter_status(c, "discarded", ("open",), by="ops")
    # When stats are taken
    stats = store.dead_letter_stats()
    # Then each group has its count and its oldest row's time, in a stable order
    oldest = {(s["status"], s["reason"], s["source"]): s["oldest"] for s in stats}
    assert [(s["status"], s["reason"], s["source"], s["count"]) for s in stats] == [
        ("discarded", "type", "crm", 1),
        ("open", "conflict", "billing", 1),
        ("open", "conflict", "crm", 2),
    ]
    assert oldest[("open", "conflict", "crm")] == pytest.approx(time.time() - 86400, abs=60)
    assert oldest[("open", "conflict", "billing")] == pytest.approx(time.time(), abs=60)


def test_no_dead_letters_means_empty_stats(store: DeadLetterStore) -> None:
    # Given no review rows, Then there are no stats and no rows
    assert store.dead_letter_stats() == []
    assert store.dead_letters(DeadLetterFilter()) == []


# -- schema ------------------------------------------------------------------------------


def test_a_store_from_before_holds_reads_as_holding_nothing_until_migrated(
    store: SqlStore, store_url: str
) -> None:
    # Given a store created before the held table existed (a rolling upgrade: the CLI is
    # updated first, and it never migrates)
    assert isinstance(store, SqlStore)
    with store.dialect.transaction() as cur:
        cur.execute("DROP TABLE held")
    old = open_store(store_url)
    try:
        # Then it holds nothing, rather than failing on the missing table
        assert old.held(SHARD) == {}
        assert old.held(SHARD, "contact:1") == {}
        # And once a worker of this version migrates it, holds are kept again
        old.migrate()
        row_id = old.commit_dead_letter(draft("e-1"), Fence(SHARD, 2))
        assert old.hold(SHARD, "contact:1", row_id, Fence(SHARD, 2)) == row_id
        assert old.held(SHARD, "contact:1") == {"contact:1": row_id}
    finally:
        old.close()


def test_migrating_an_existing_store_again_keeps_what_it_holds(
    store: SqlStore, store_url: str
) -> None:
    # Given a store with a record, a journal entry, a fence and a review row
    store.commit_event(write("e-1", "contact:1", {"n": 1}, 0), Fence(SHARD, 2))
    row_id = store.commit_dead_letter(draft("e-2"), Fence(SHARD, 2))
    assert store.hold(SHARD, "contact:1", row_id, Fence(SHARD, 2)) == row_id
    # When another process opens the same store and migrates it again
    again = open_store(store_url)
    try:
        again.migrate()
        # Then everything is still there, and new rows go on from the old ones
        assert again.read("contact:1").fields == {"n": 1}
        assert again.journal("crm", "e-1") is not None
        assert again.fence_of(SHARD) == 2
        assert again.dead_letter(row_id) is not None
        assert again.held(SHARD) == {"contact:1": row_id}
        assert again.commit_dead_letter(draft("e-3"), None) > row_id
    finally:
        again.close()


# -- record keys and JSON ----------------------------------------------------------------


def test_record_keys_lists_by_literal_prefix_in_key_order(store: RecordStore) -> None:
    # Given records with look-alike keys
    keys = ["contact:2", "contact:10", "contact:1", "deal:1", "con%tact", "con_tact", "👍:1", "👍x"]
    for key in keys:
        store.write_outside(key, {}, 0)
    # When keys are listed by prefix, Then they match it literally, sorted, up to the limit
    assert store.record_keys() == sorted(keys)
    assert store.record_keys("contact:") == ["contact:1", "contact:10", "contact:2"]
    assert store.record_keys("contact:1") == ["contact:1", "contact:10"]
    assert store.record_keys("con%") == ["con%tact"]
    assert store.record_keys("con_") == ["con_tact"]
    assert store.record_keys("👍") == ["👍:1", "👍x"]
    assert store.record_keys("contact:", limit=2) == ["contact:1", "contact:10"]
    assert store.record_keys("nothing") == []


def test_scan_records_pages_through_a_prefix_in_key_order(store: RecordStore) -> None:
    # Given records under two prefixes
    for n in range(7):
        store.write_outside(f"contact:{n}", {"n": n}, 0)
    store.write_outside("deal:1", {"n": 99}, 0)
    # When a sweep reads the contacts three at a time, each page after the last key
    pages, after = [], ""
    while page := store.scan_records("contact:", after, 3):
        pages.append([(r.key, r.fields["n"], r.revision) for r in page])
        after = page[-1].key
    # Then it reads every contact once, in key order, with its fields and revision
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [row for p in pages for row in p] == [(f"contact:{n}", n, 1) for n in range(7)]


JSON_SAMPLE = {
    "name": "Zoë Ångström — 東京 🚀",
    "rtl": "שלום",
    "combining": "e\u0301",
    "escapes": 'quote " backslash \\ newline \n tab \t',
    "nested": {"list": [1, -2.5, None, True, False, {"deep": [[], {}]}], "empty": ""},
    "big": 2**70,
    "small": -(2**63),
    "float": 0.1,
    "tiny": 1e-12,
    "ünïcødé key 🔑": [1],
}


def test_fields_and_review_payloads_round_trip_unicode_and_nesting(store: SqlStore) -> None:
    # Given values with unicode, escapes, nesting, big ints and floats
    # When they are written as a record and as a review row's event and change
    store.commit_event(write("evt-1", "contact:ü", JSON_SAMPLE, 0), None)
    d = replace(draft("evt-2", "contact:ü"), event=JSON_SAMPLE, attempted_change=JSON_SAMPLE)
    row = store.commit_dead_letter(d, None)
    # Then they read back equal
    assert store.read("contact:ü").fields == JSON_SAMPLE
    got = store.dead_letter(row)
    assert got is not None
    assert got.event == got.attempted_change == JSON_SAMPLE


json_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)
    | json_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
    max_leaves=15,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=st.dictionaries(json_text, json_values, max_size=5))
def test_any_json_fields_round_trip(store: RecordStore, fields: dict[str, Any]) -> None:
    # Given any JSON object (text without NUL, numbers below 1e15: see the tests below)
    record = store.read("any")
    # When it is written over the record, Then it reads back equal
    store.write_outside("any", fields, record.revision)
    assert store.read("any").fields == fields


@pytest.mark.parametrize("value", ["a\x00b", {"k\x00": 1}])
def test_text_with_nul_round_trips(
    store: SqlStore, store_url: str, request: pytest.FixtureRequest, value: Any
) -> None:
    # Given a JSON string holding NUL, which json.loads accepts from a sender ("\u0000")
    # When it is written as a record and a review row, Then both read back equal
    store.write_outside("contact:1", {"v": value}, 0)
    assert store.read("contact:1").fields == {"v": value}
    row = store.commit_dead_letter(replace(draft("e"), event={"v": value}), None)
    got = store.dead_letter(row)
    assert got is not None
    assert got.event == {"v": value}


@pytest.mark.parametrize("value", [1e16, 1.2345678901234567e20, -3e300])
def test_large_floats_round_trip_as_the_same_float(
    store: RecordStore, store_url: str, request: pytest.FixtureRequest, value: float
) -> None:
    # Given a float that Python writes in exponent form
    # When it is stored and read back, Then it is the same float, still a float
    store.write_outside("contact:1", {"v": value}, 0)
    got = store.read("contact:1").fields["v"]
    assert type(got) is float
    assert got == value


# -- concurrency -------------------------------------------------------------------------

WRITERS = 8
INCREMENTS = 200


def test_concurrent_read_modify_write_increments_are_exact(store: SqlStore, store_url: str) -> None:
    # Given 8 writers, each with its own connection, incrementing one counter
    start = threading.Barrier(WRITERS, timeout=60)
    conflicts = [0] * WRITERS
    errors: list[BaseException] = []
    plus_one = {"n": Change(op="increment", value=1)}

    url = without_commit_flush(store_url)

    def writer(w: int) -> None:
        own = open_store(url, timeout_ms=30_000)
        try:
            start.wait()
            for i in range(INCREMENTS):
                while True:
                    record = own.read("counter")
                    fields = apply_changes(record.fields, plus_one)
                    try:
                        own.commit_event(
                            write(f"w{w}-{i}", "counter", fields, record.revision), None
                        )
                        break
                    except VersionConflict:
                        conflicts[w] += 1
        except BaseException as exc:
            errors.append(exc)
            start.abort()
        finally:
            own.close()

    # When each does 200 read-increment-conditional-write cycles, retrying on conflict
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    # Then no increment was lost or doubled: 1,600 and revision 1,600
    record = store.read("counter")
    assert record.fields == {"n": WRITERS * INCREMENTS}
    assert record.revision == WRITERS * INCREMENTS
    # And every event was journaled once, each with its own revision
    assert store.journal_size() == WRITERS * INCREMENTS
    revisions = [e.revision for e in store.journal_entries("counter")]
    assert revisions == list(range(1, WRITERS * INCREMENTS + 1))
    # And the writers really raced (conflicts were retried, not avoided)
    assert sum(conflicts) > 0


def without_commit_flush(store_url: str) -> str:
    """The store URL, for PostgreSQL with ``synchronous_commit=off``: commits are visible
    and atomic exactly as before, only not flushed to disk before they return (which
    this 2-core machine spends most of the race's time on). SQLite's URL is unchanged."""
    if not is_postgres(store_url):
        return store_url
    parts = urlsplit(store_url)
    query_args = dict(parse_qsl(parts.query))
    options = query_args.get("options", "")
    query_args["options"] = f"{options} -csynchronous_commit=off".strip()
    return urlunsplit(parts._replace(query=urlencode(query_args, quote_via=quote)))


def _fence_race(store_url: str, shard: int) -> None:
    """An old owner writes with token 1 in a loop while a new owner advances to 2."""
    key = f"raced:{shard}"
    advanced = threading.Event()
    outcomes: list[tuple[int, bool, str]] = []  # (event number, started after advance, result)
    written = threading.Semaphore(0)
    errors: list[BaseException] = []

    def old_owner() -> None:
        own = open_store(store_url, timeout_ms=30_000)
        try:
            after = 0
            # Until 20 writes were started after the advance, however long the advance
            # takes to come on a busy machine (a fixed count of writes ran out first)
            deadline = time.monotonic() + 120
            for i in itertools.count():
                if time.monotonic() > deadline:
                    raise TimeoutError("the fence advance never came")
                late = advanced.is_set()
                record = own.read(key)
                try:
                    own.commit_event(
                        write(f"old-{shard}-{i}", key, {"n": i}, record.revision), Fence(shard, 1)
                    )
                    outcomes.append((i, late, "ok"))
                    written.release()
                except StaleFence as exc:
                    outcomes.append((i, late, f"stale {exc.token}<{exc.current}"))
                after += late
                if after >= 20:
                    return
        except BaseException as exc:
            errors.append(exc)
        finally:
            written.release()
            own.close()

    thread = threading.Thread(target=old_owner)
    thread.start()
    new_owner = open_store(store_url, timeout_ms=30_000)
    try:
        # (let the old owner get a few writes in, then advance while it is mid-loop)
        for _ in range(10):
            assert written.acquire(timeout=30), errors
            assert not errors, errors
        assert new_owner.advance_fence(shard, 2) == 2
        advanced.set()
        committed_at_advance = len(new_owner.journal_entries(key))
        thread.join(60)
        assert not thread.is_alive()
        assert not errors, errors
        # Then every write the old owner started after the advance returned was refused ...
        late = [o for o in outcomes if o[1]]
        assert len(late) >= 20
        assert all(result == "stale 1<2" for _, _, result in late), late
        # ... and no write with token 1 committed after the advance had committed
        ok = [f"old-{shard}-{i}" for i, _, result in outcomes if result == "ok"]
        journaled = new_owner.journal_entries(key)
        assert sorted(e.event_id for e in journaled) == sorted(ok)
        assert {e.fence for e in journaled} == {1}
        assert committed_at_advance == len(ok)
        # And the record holds exactly the old owner's accepted writes
        assert new_owner.read(key).revision == len(ok)
        assert new_owner.fence_of(shard) == 2
    finally:
        new_owner.close()


def test_once_a_fence_advance_commits_no_older_token_writes(
    store: FenceStore, store_url: str
) -> None:
    # Given a shard owned with token 1 (registered, as a lane does on acquiring it)
    # When the old owner keeps writing while a new owner advances the fence to 2,
    # three times on three shards
    for shard in (11, 12, 13):
        assert store.advance_fence(shard, 1) == 1
        # Then (checked inside) nothing with token 1 lands after the advance
        _fence_race(store_url, shard)


@contextlib.contextmanager
def _advance_in_flight(store_url: str, shard: int, token: int) -> Iterator[Any]:
    """A new owner's fence advance that has written its row but not yet committed."""
    sql = "INSERT INTO shard_fences (shard, token, updated_at) VALUES (?, ?, ?)"
    params = (shard, token, time.time())
    if is_postgres(store_url):
        with psycopg.connect(store_url) as conn:
            conn.execute(sql.replace("?", "%s"), params)
            yield conn
            conn.commit()
    else:
        with raw_sql(store_url) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, params)
            yield conn
            conn.execute("COMMIT")


def _someone_waits_on(conn: Any, store_url: str) -> bool:
    if not is_postgres(store_url):
        time.sleep(0.3)  # SQLite: the writer waits on BEGIN IMMEDIATE or has not begun
        return True
    row = conn.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted "
        "AND transactionid::text = (txid_current() % 4294967296)::text"
    ).fetchone()
    return bool(row[0])


def test_a_first_fenced_write_racing_a_fence_advance_is_refused(
    store: SqlStore, store_url: str, request: pytest.FixtureRequest
) -> None:
    # Given a shard with no fence row yet, and a new owner's advance to 2 in flight
    outcome: list[str] = []

    def old_owner() -> None:
        own = open_store(store_url, timeout_ms=30_000)
        try:
            own.commit_event(write("old-1", "contact:1", {"n": 1}, 0), Fence(SHARD, 1))
            outcome.append("written")
        except StaleFence:
            outcome.append("stale")
        finally:
            own.close()

    thread = threading.Thread(target=old_owner)
    try:
        with _advance_in_flight(store_url, SHARD, 2) as conn:
            # When the old owner writes with token 1 (and blocks on the advance's row)
            thread.start()
            deadline = time.monotonic() + 20
            while not _someone_waits_on(conn, store_url):
                assert time.monotonic() < deadline, "the write never waited on the advance"
                time.sleep(0.02)
            # And the advance commits
    finally:
        thread.join(30)
    # Then the old owner's write is refused and nothing of it is stored
    assert outcome == ["stale"]
    assert store.fence_of(SHARD) == 2
    assert not store.read("contact:1").exists
    assert store.journal("crm", "old-1") is None
