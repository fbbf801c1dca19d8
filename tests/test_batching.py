"""Batching a hot record: when several events of one record wait, its lane applies them
with one read and one write, a journal entry each, in one transaction. Real receiver and
worker processes, real Redis, both stores; the events are queued before the worker starts,
so the batches that form are exactly known and checked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from keylane.routing.contract.settings import FaultSpec
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.stack import Stack, event, wait_until

pytestmark = pytest.mark.slow

LIMIT = 32  # settings.batch_max: the demo source's batch limit


def _numbered(prefix: str, key: str, count: int) -> list[dict[str, object]]:
    """``count`` events of ``key``: event i adds i to ``n`` and appends i to ``seq``."""
    return [
        event(f"{prefix}-{i}", key, n={"increment": i}, seq={"append": i}) for i in range(count)
    ]


def _queue(stack: Stack, bodies: list[dict[str, object]]) -> None:
    """Deliver each body in order, one at a time (the order the record must see)."""
    for body in bodies:
        assert stack.post(body).status_code == 202


def test_a_hot_record_is_written_once_per_batch_with_every_event_in_order(
    stack: Stack,
) -> None:
    # Given 200 events of one record waiting in its shard queue
    stack.receiver()
    count = 200
    _queue(stack, _numbered("hot", "contact:hot", count))
    # When a worker starts
    stack.worker()
    stack.wait_all_owned()
    stack.wait_journal(count)
    # Then every event applied once, in order, and the record was written once per batch
    store = stack.open_store()
    record = store.read("contact:hot")
    assert record.fields["seq"] == list(range(count))
    assert record.fields["n"] == sum(range(count))
    assert record.revision == math.ceil(count / LIMIT)
    entries = store.journal_entries("contact:hot")
    assert sorted(e.event_id for e in entries) == sorted(f"hot-{i}" for i in range(count))
    assert {e.outcome for e in entries} == {"applied"}
    # And each event's journal entry names the write that carried it
    revisions = {e.event_id: e.revision for e in entries}
    for i in range(count):
        assert revisions[f"hot-{i}"] == i // LIMIT + 1
    assert stack.settled_counters().get("applied") == count


def test_a_batch_takes_a_records_events_whatever_comes_between_them(stack: Stack) -> None:
    # Given two records of one shard, their events queued in runs: a a a a a b b b a a a a
    shards = stack.settings.shards
    a = "contact:a"
    b = next(
        f"contact:b{i}"
        for i in range(10_000)
        if shards.shard_for_key(f"contact:b{i}") == shards.shard_for_key(a)
    )
    stack.receiver()
    runs = [(a, 5), (b, 3), (a, 4)]
    bodies: list[dict[str, object]] = []
    for key, length in runs:
        for _ in range(length):
            bodies.append(event(f"e-{len(bodies)}", key, seq={"append": len(bodies)}))
    _queue(stack, bodies)
    # When a worker starts
    stack.worker()
    stack.wait_all_owned()
    stack.wait_journal(len(bodies))
    # Then each record's waiting events were one batch of its own, in order (the record,
    # not the shard, is what a batch is made of)
    store = stack.open_store()
    assert store.read(a).fields["seq"] == [0, 1, 2, 3, 4, 8, 9, 10, 11]
    assert store.read(a).revision == 1
    assert store.read(b).fields["seq"] == [5, 6, 7]
    assert store.read(b).revision == 1


def test_an_event_that_cannot_apply_is_split_out_and_its_neighbours_keep_their_order(
    stack: Stack,
) -> None:
    # Given 40 events of one record, the 11th of which cannot apply (it increments text)
    stack.receiver()
    bodies = [event("x-0", "contact:x", name={"set": "Ada"}, seq={"append": 0})]
    for i in range(1, 40):
        if i == 10:
            bodies.append(event("x-10", "contact:x", name={"increment": 1}))
        else:
            bodies.append(event(f"x-{i}", "contact:x", seq={"append": i}))
    _queue(stack, bodies)
    # When a worker starts
    stack.worker()
    stack.wait_all_owned()
    stack.wait_journal(40)
    # Then the ten events before it went in as one write, it became a review row alone,
    # and the events after it were taken together again: one more write
    store = stack.open_store()
    record = store.read("contact:x")
    assert record.fields["seq"] == [i for i in range(40) if i != 10]
    assert record.fields["name"] == "Ada"
    assert record.revision == 2
    rows = store.dead_letters(DeadLetterFilter())
    assert [(r.event_id, r.reason) for r in rows] == [("x-10", "type")]
    entries = {e.event_id: e.outcome for e in store.journal_entries("contact:x")}
    assert len(entries) == 40
    assert entries.pop("x-10") == "dead_lettered"
    assert set(entries.values()) == {"applied"}


def test_a_worker_killed_after_a_batch_commits_leaves_one_effect_per_event(
    stack: Stack,
) -> None:
    # Given 100 events of one record waiting, and a worker that is killed (SIGKILL) right
    # after its first batch commits, before any of its messages is acknowledged
    stack.receiver()
    count = 100
    _queue(stack, _numbered("k", "contact:k", count))
    stack.settings.faults.append(
        FaultSpec(point="worker.before_ack", action="kill", match="contact:k", times=1)
    )
    doomed = stack.worker()
    stack.settings.faults.clear()
    wait_until(lambda: not doomed.alive(), 60, "the worker to be killed", on_timeout=stack.logs)
    store = stack.open_store()
    assert store.journal_size() == LIMIT, "the first batch committed before the kill"
    # When another worker takes the shard over
    stack.worker()
    stack.wait_all_owned()
    stack.wait_journal(count)
    # Then the killed batch's events are found applied (no second effect), the rest apply,
    # and the record holds every event once, in order
    wait_until(
        lambda: stack.view().counters().get("applied", 0) == count - LIMIT,
        60,
        "the remaining events to be acknowledged",
        on_timeout=stack.logs,
    )
    record = store.read("contact:k")
    assert record.fields["seq"] == list(range(count))
    assert record.fields["n"] == sum(range(count))
    counters = stack.settled_counters()
    assert counters.get("duplicate") == LIMIT
    assert store.dead_letters(DeadLetterFilter()) == []
    assert {e.outcome for e in store.journal_entries("contact:k")} == {"applied"}


SOURCES = """
[sources.totals]
batch_handler = "tests.support.handlers:running_totals"
batch = 8

[sources.single]
batch = 1
"""


def test_a_batch_handler_is_called_once_per_batch_and_a_source_can_opt_out(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source whose batch handler sees each batch at once (8 at most), and a
    # source that never batches
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    stack.settings = stack.settings.model_copy(update={"sources_file": sources})
    stack.receiver()
    count = 30
    for i in range(count):
        body = event(f"t-{i}", "acct:1", amount={"set": i + 1})
        assert stack.post(body, source="totals").status_code == 202
    for i in range(count):
        body = event(f"s-{i}", "acct:2", seq={"append": i})
        assert stack.post(body, source="single").status_code == 202
    # When a worker starts
    stack.worker()
    stack.wait_all_owned()
    stack.wait_journal(2 * count)
    # Then the running total is exact, from one handler call per batch of 8
    store = stack.open_store()
    totals = store.read("acct:1")
    assert totals.fields["total"] == sum(range(1, count + 1))
    assert totals.fields["calls"] == math.ceil(count / 8) == totals.revision
    # And the source that opted out wrote once per event
    single = store.read("acct:2")
    assert single.fields["seq"] == list(range(count))
    assert single.revision == count
