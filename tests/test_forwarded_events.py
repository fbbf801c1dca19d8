"""Events forwarded from an absorbed key to its survivor (workers/merges.py ``forward``):
each one's journal row names the key it was sent to (``via``), on both stores, through the
archive, and ``keylane journal find --key`` of the absorbed key finds them; a store from
before ``via`` gets the column when a worker migrates it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from keylane.ops.retention import prune
from keylane.workers.lane_store import event_write
from keylane.workers.merges import live_end
from keylane.workers.store_rows import DeadLetterDraft
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.lane_parts import lane_event
from tests.support.stack import Stack, send_all, wait_until

DAY = 86400
ALICE, ALLIE = "person:alice@example.com", "person:allie"


def _forwarded(event_id: str, sent_to: str, survivor: str) -> Any:
    """The write of an event sent to ``sent_to``, forwarded to ``survivor``."""
    event = lane_event(event_id, survivor).model_copy(update={"via": sent_to})
    return event_write(event, {"visits": 1}, 0, 1, result={"fields": {"visits": 1}})


def test_a_forwarded_events_journal_row_names_the_key_it_was_sent_to(store: SqlStore) -> None:
    # Given an event sent to p:2 and applied to p:1, and another that became a dead letter
    store.commit_event(_forwarded("e-1", "p:2", "p:1"), None)
    event = lane_event("e-2", "p:1").model_copy(update={"via": "p:2"})
    dead = DeadLetterDraft(
        "crm", "e-2", "p:1", 2, "conflict", event.model_dump(mode="json"), {}, 1, 2, 3, "x"
    )
    store.commit_dead_letter(dead, None)
    store.commit_event(event_write(lane_event("e-3", "p:2"), {"own": 1}, 0, 1), None)
    # Then each journal row names p:2, and p:2's events are found with them
    entry = store.journal("crm", "e-1")
    assert entry is not None
    assert (entry.record_key, entry.via) == ("p:1", "p:2")
    assert [(e.event_id, e.via) for e in store.journal_entries("p:1")] == [
        ("e-2", "p:2"),
        ("e-1", "p:2"),
    ]
    found = {e.event_id: e.via for e in store.find_journal(record_key="p:2")}
    assert found == {"e-1": "p:2", "e-2": "p:2", "e-3": None}
    # And the rows the prune archives keep every column: the result and via too
    rows = {r["event_id"]: r for r in store.old_rows("journal", time.time() + 60, 10, "crm")}
    assert rows["e-1"]["via"] == "p:2"
    assert rows["e-1"]["result"] == {"revision": 1, "fields": {"visits": 1}}


def test_a_store_from_before_via_gets_the_column_when_migrated(
    store: SqlStore, store_url: str
) -> None:
    # Given a store whose journal has no via column, with a row in it
    with store.dialect.transaction() as cur:
        cur.execute("DROP INDEX journal_via")
        cur.execute("ALTER TABLE journal DROP COLUMN via")
        cur.execute(
            "INSERT INTO journal (source, event_id, record_key, shard, outcome, revision, "
            "attempts, recorded_at) VALUES ('crm', 'old', 'p:1', 2, 'applied', 1, 1, 0)"
        )
    # When a worker of this version opens and migrates it
    again = open_store(store_url)
    try:
        again.migrate()
        # Then the old row reads as forwarded from nowhere, and a new one keeps its via
        old = again.journal("crm", "old")
        assert old is not None
        assert old.via is None
        again.commit_event(_forwarded("new", "p:2", "p:3"), None)
        assert [e.event_id for e in again.find_journal(record_key="p:2")] == ["new"]
        again.migrate()  # and again: nothing changes
        assert again.journal_size() == 2
    finally:
        again.close()


@pytest.mark.slow
def test_a_hundred_forwarded_events_are_each_journaled_with_the_key_they_were_sent_to(
    stack: Stack,
) -> None:
    # Given Alice (by email) and Allie, merged when Allie's record names Alice's email
    stack.receiver()
    stack.worker(lanes=8)
    stack.wait_all_owned()
    store = stack.open_store()
    first = {"id": "a-1", "type": "t", "record_key": ALICE, "also": ["email:alice@example.com"],
             "changes": {"name": {"set": "Alice"}}}  # fmt: skip
    assert stack.post(first).status_code == 202
    wait_until(lambda: store.journal("demo", "a-1") is not None, 60, "a-1", on_timeout=stack.logs)
    link = {"id": "allie-1", "type": "t", "record_key": ALLIE,
            "also": ["email:alice@example.com"], "changes": {"nick": {"set": "Allie"}}}  # fmt: skip
    assert stack.post(link).status_code == 202
    wait_until(lambda: "nick" in store.read(ALICE).fields, 60, "the merge", on_timeout=stack.logs)
    assert live_end(store, ALLIE).key == ALICE
    # When 100 events are sent to Allie's key, by 8 senders at once
    sent = [
        {"id": f"fwd-{n}", "type": "t", "record_key": ALLIE, "changes": {"n": {"increment": 1}}}
        for n in range(100)
    ]
    assert {a.status_code for a in send_all(stack, sent, senders=8)} == {202}
    ids = [body["id"] for body in sent]

    def journaled() -> bool:
        return all(store.journal("demo", i) is not None for i in ids)

    wait_until(journaled, 120, "100 forwarded events", on_timeout=stack.logs, interval_s=0.2)
    # Then each applied once to Alice's record, its journal row naming Allie's key
    assert store.read(ALICE).fields["n"] == 100
    for event_id in ids:
        entry = store.journal("demo", event_id)
        assert entry is not None
        assert (entry.outcome, entry.record_key, entry.via) == ("applied", ALICE, ALLIE)
    # And `keylane journal find --key` of Allie's key finds them, with its own events
    rows = _find(stack, "--key", ALLIE)
    forwarded = [r for r in rows if r["event_id"].startswith("fwd-")]
    assert sorted(r["event_id"] for r in forwarded) == sorted(ids)
    assert {(r["record_key"], r["via"], r["where"]) for r in forwarded} == {(ALICE, ALLIE, "table")}
    assert {r["event_id"] for r in rows} - set(ids) >= {"allie-1"}
    # And its text names the key in the VIA column
    text = stack.keylane("journal", "find", "fwd-7")
    assert text.returncode == 0, text.stderr
    header, row = text.stdout.splitlines()
    assert header.split()[:6] == ["WHERE", "SOURCE", "EVENT_ID", "RECORD_KEY", "VIA", "OUTCOME"]
    assert row.split()[:6] == ["table", "demo", "fwd-7", ALICE, ALLIE, "applied"]
    # And once the prune has archived them, the archive keeps via and finds them too
    prune(stack.settings, store, store, None, now=time.time() + 40 * DAY)
    assert store.journal_entries(ALICE) == []
    archived = [r for r in _find(stack, "--key", ALLIE) if r["event_id"].startswith("fwd-")]
    assert len(archived) == 100
    assert {(r["via"], r["where"].startswith("journal/")) for r in archived} == {(ALLIE, True)}
    assert all(r["result"]["fields"]["n"] >= 1 for r in archived)


def _find(stack: Stack, *args: str) -> list[dict[str, Any]]:
    done = stack.keylane("journal", "find", *args, "--json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))
