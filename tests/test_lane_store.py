"""workers/lane_store.py: the lanes' store calls as awaitables, with group commit, against
a real SQLite store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.routing.contract.errors import AlreadyApplied, StaleFence, VersionConflict
from keylane.routing.contract.events import Event
from keylane.workers.blocking import BlockingPool
from keylane.workers.lane_store import LaneStore, event_write
from keylane.workers.results import ApplyResult
from keylane.workers.store import FenceStore
from keylane.workers.store_rows import EventWrite, Fence
from tests.support.lane_parts import SqliteOpener, lane_event

FENCE = Fence(shard=2, token=1)


@pytest.fixture
def opened(tmp_path: Path) -> SqliteOpener:
    return SqliteOpener(tmp_path / "store.sqlite3")


@pytest.fixture
def io(opened: SqliteOpener) -> Iterator[BlockingPool]:
    pool = BlockingPool(1, opened)
    pool.start()
    yield pool
    pool.stop()


def write(event_id: str, key: str, n: int, expected: int) -> EventWrite:
    return event_write(lane_event(event_id, key), {"n": n}, expected, attempts=1)


async def commits_while_busy(
    lanes: LaneStore, writes: list[list[EventWrite]], fence: Fence | None = FENCE
) -> list[int | BaseException]:
    """Each lane's commit, all handed in while the pool's one thread is busy."""
    busy = threading.Event()
    blocker = asyncio.ensure_future(lanes.io.call(busy.wait, 5.0))
    commits = [asyncio.ensure_future(lanes.commit(w, fence)) for w in writes]
    await asyncio.sleep(0.01)
    busy.set()
    await blocker
    return await asyncio.gather(*commits, return_exceptions=True)


def test_commits_handed_in_while_the_store_is_busy_go_in_one_transaction(
    io: BlockingPool, opened: SqliteOpener
) -> None:
    lanes = LaneStore(io)
    writes = [[write(f"e{n}", f"contact:{n}", n, 0)] for n in range(5)]
    before = opened.transactions()
    assert asyncio.run(commits_while_busy(lanes, writes)) == [1, 1, 1, 1, 1]
    assert opened.transactions() - before == 1
    assert asyncio.run(lanes.read("contact:3")).fields == {"n": 3}


def test_a_group_holds_at_most_group_max_commits(io: BlockingPool, opened: SqliteOpener) -> None:
    lanes = LaneStore(io, group_max=2)
    writes = [[write(f"e{n}", f"contact:{n}", n, 0)] for n in range(5)]
    assert asyncio.run(commits_while_busy(lanes, writes)) == [1, 1, 1, 1, 1]
    assert opened.transactions() == 3


def test_a_refused_commit_is_raised_in_its_own_lane_and_the_others_apply(io: BlockingPool) -> None:
    # Given contact:1 at revision 1 and e1 journaled
    lanes = LaneStore(io)
    assert asyncio.run(lanes.commit([write("e1", "contact:1", 1, 0)], FENCE)) == 1
    # When four lanes commit together: a stale read, a redelivery and two good writes
    answers = asyncio.run(
        commits_while_busy(
            lanes,
            [
                [write("e2", "contact:1", 2, 0)],  # read before e1
                [write("e1", "contact:9", 1, 0)],  # e1 again
                [write("e3", "contact:1", 3, 1)],
                [write("e4", "contact:2", 4, 0)],
            ],
        )
    )
    # Then each answer is what committing alone would have given
    assert isinstance(answers[0], VersionConflict)
    assert isinstance(answers[1], AlreadyApplied)
    assert answers[2:] == [2, 1]
    assert asyncio.run(lanes.read("contact:1")).fields == {"n": 3}
    assert asyncio.run(lanes.read("contact:9")).revision == 0


def advance_fence(store: FenceStore, shard: int, token: int) -> int:
    return store.advance_fence(shard, token)


def test_a_commit_under_an_older_fence_is_refused(io: BlockingPool) -> None:
    async def lane() -> None:
        await lanes.io.store(advance_fence, 2, 5)
        await lanes.commit([write("e1", "contact:1", 1, 0)], Fence(shard=2, token=4))

    lanes = LaneStore(io)
    with pytest.raises(StaleFence):
        asyncio.run(lane())
    assert asyncio.run(lanes.read("contact:1")).revision == 0


def test_a_batch_is_one_commit_of_its_events(io: BlockingPool) -> None:
    lanes = LaneStore(io)
    batch = [write("e1", "contact:1", 1, 0), write("e2", "contact:1", 2, 0)]
    assert asyncio.run(lanes.commit(batch, FENCE)) == 1
    entries = asyncio.run(
        lanes.journal([lane_event("e1", "contact:1"), lane_event("e9", "contact:1")])
    )
    assert entries[0] is not None
    assert (entries[0].outcome, entries[0].revision) == ("applied", 1)
    assert entries[1] is None
    assert asyncio.run(lanes.read("contact:1")).fields == {"n": 2}


def test_delivered_events_are_journaled_without_a_record_change(io: BlockingPool) -> None:
    lanes = LaneStore(io)
    events = [lane_event("d1", "contact:1"), lane_event("d2", "contact:1")]
    results = asyncio.run(lanes.journal_delivered(events, FENCE, attempts=2))
    assert results == [ApplyResult("applied", attempts=2)] * 2
    entries = asyncio.run(lanes.journal(events))
    assert [(e.outcome, e.revision, e.attempts) for e in entries if e] == [("applied", None, 2)] * 2
    assert asyncio.run(lanes.read("contact:1")).exists is False


def test_delivered_events_already_journaled_are_duplicates_and_the_rest_applied(
    io: BlockingPool,
) -> None:
    lanes = LaneStore(io)
    asyncio.run(lanes.journal_delivered([lane_event("d2", "contact:1")], FENCE, attempts=1))
    events = [lane_event(f"d{n}", "contact:1") for n in (1, 2, 3)]
    results = asyncio.run(lanes.journal_delivered(events, FENCE, attempts=1))
    assert [r.outcome for r in results] == ["applied", "duplicate", "applied"]
    assert all(asyncio.run(lanes.journal(events)))


def test_a_merging_tasks_events_keep_their_keys_row_and_claim_identities_refused_or_not(
    io: BlockingPool, opened: SqliteOpener
) -> None:
    # Given events of a task that merges, each naming an identity: one delivered, one
    # refused, one refused with a review row
    lanes = LaneStore(io)

    def named(event_id: str, key: str, identity: str) -> Event:
        return lane_event(event_id, key).model_copy(update={"identities": (identity,)})

    kept = "task:sync_person"
    delivered = [named("t1", "person:a", "email:a@example.com")]
    refused = [named("t2", "person:b", "email:b@example.com")]
    reviewed = [named("t3", "person:c", "email:c@example.com")]
    # When each is journaled as the dispatcher journals it
    asyncio.run(lanes.journal_delivered(delivered, FENCE, 1, keeps_keys=kept))
    asyncio.run(lanes.journal_delivered(refused, FENCE, 1, "refused", None, "no", kept))
    asyncio.run(lanes.journal_refused_with_review(reviewed, FENCE, 1, None, "no", kept))
    # Then each key has its row of no fields, saying whose it is, and holds its identity
    store = opened()
    for key, letter in (("person:a", "a"), ("person:b", "b"), ("person:c", "c")):
        row = store.read(key)
        assert (row.exists, row.fields, row.kept_for) == (True, {}, kept)
        assert store.identities_of(key) == [f"email:{letter}@example.com"]
    # And without keeps_keys (a task that does not merge) no row is written
    asyncio.run(lanes.journal_delivered([named("t4", "person:d", "email:d@x.co")], FENCE, 1))
    assert store.read("person:d").exists is False
    assert store.identities_of("person:d") == []


def test_event_write_carries_the_events_identity_and_retry() -> None:
    event = lane_event("e1", "contact:1", shard=7).model_copy(update={"retry_of": 12})
    assert event_write(event, None, 3, 2) == EventWrite(
        source="crm",
        event_id="e1",
        record_key="contact:1",
        shard=7,
        fields=None,
        expected_revision=3,
        attempts=2,
        retry_of=12,
    )
