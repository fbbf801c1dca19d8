"""A batched delivery (one request, many events: HubSpot's array, Meta's changes,
Salesforce's notifications) through a real receiver and worker: each item an event of its
own record, all of them queued in one step or none (a 2xx only when every item is), a
retried delivery a duplicate of each item even re-batched, and each bad delivery a 4xx
that records nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from keylane.workers.store_rows import DeadLetterFilter
from tests.support.stack import Stack, wait_until

# Batching is the receiver's: one store kind is enough (the lanes are tested on both).
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

SOURCES = """
[sources.crm]
verify = { scheme = "none" }
format = "mapped"
items = "body:*"
event_id = "body:eventId"
event_type = "body:kind"
digest_excludes = ["attemptNumber"]
record_key = "contact:{body:objectId}"
owns = ["visits", "last"]
on.visit = { visits = { increment = "body:n" }, last = { set = "body:eventId" } }

[sources.strict]
verify = { scheme = "none" }
format = "mapped"
items = "body:events.*"
event_id = "body:id"
missing_id = "reject"
record_key = "contact:{body:who}"
on."*" = { visits = { increment = 1 } }
"""


def item(
    event_id: int, contact: int, n: int = 1, attempt: int = 0, kind: str = "visit"
) -> dict[str, Any]:
    """One event of the crm source's array, as a HubSpot-like sender writes it."""
    return {
        "eventId": event_id,
        "objectId": contact,
        "n": n,
        "kind": kind,
        "attemptNumber": attempt,
    }


def start(stack: Stack, tmp_path: Path, worker: bool = True, **settings: Any) -> Stack:
    stack.use_sources(SOURCES, **settings)
    if worker:
        stack.worker(lanes=4)
    stack.receiver()
    if worker:
        stack.wait_all_owned()
    return stack


def post(stack: Stack, body: Any, source: str = "crm", **headers: str) -> httpx.Response:
    return stack.post(json.dumps(body).encode(), source=source, **headers)


def queued(stack: Stack) -> int:
    view = stack.view()
    return sum(view.depth(shard) for shard in range(stack.settings.shard_count))


def visits(stack: Stack, contact: int) -> Any:
    return stack.open_store().read(f"contact:{contact}").fields.get("visits")


@SQLITE
def test_each_item_is_an_event_of_its_own_record_and_a_retry_is_a_duplicate_of_each(
    stack: Stack, tmp_path: Path
) -> None:
    start(stack, tmp_path)
    # Given one delivery of four events for three contacts (two for contact 1)
    delivery = [item(1, 1, 2), item(2, 2, 5), item(3, 1, 3), item(4, 3, 7)]
    answer = post(stack, delivery)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert [i["status"] for i in body["items"]] == ["accepted"] * 4
    assert [i["record_key"] for i in body["items"]] == [
        "contact:1", "contact:2", "contact:1", "contact:3",
    ]  # fmt: skip
    stack.wait_journal(4)
    # Then each is applied to its record, contact 1's two in the order they came
    assert (visits(stack, 1), visits(stack, 2), visits(stack, 3)) == (5, 5, 7)
    assert stack.open_store().read("contact:1").fields["last"] == 3
    # When the sender retries it, its attemptNumber raised, re-batched in another order
    # and with one new event
    retry = [item(4, 3, 7, attempt=1), item(2, 2, 5, attempt=1), item(5, 2, 1)]
    again = post(stack, [*retry, item(1, 1, 2, attempt=1), item(3, 1, 3, attempt=1)])
    # Then the four seen are duplicates, the new one accepted, nothing applied twice
    assert again.status_code == 202, again.text
    replayed = [i.get("replayed", False) for i in again.json()["items"]]
    assert replayed == [True, True, False, True, True]
    stack.wait_journal(5)
    assert (visits(stack, 1), visits(stack, 2), visits(stack, 3)) == (5, 6, 7)
    # And a retry of nothing but seen events is a 200 replay
    replay = post(stack, delivery)
    assert replay.status_code == 200
    assert replay.headers["keylane-replayed"] == "true"


@SQLITE
def test_an_item_reusing_an_id_with_another_body_is_recorded_for_review_not_applied(
    stack: Stack, tmp_path: Path
) -> None:
    start(stack, tmp_path)
    assert post(stack, [item(10, 7, 1)]).status_code == 202
    stack.wait_journal(1)
    # When a later delivery reuses event 10 with another body, beside a new event
    answer = post(stack, [item(10, 7, 100), item(11, 7, 1)])
    # Then the delivery is taken: the new one accepted, the reused one recorded for review
    assert answer.status_code == 202, answer.text
    assert [i["status"] for i in answer.json()["items"]] == ["reused", "accepted"]
    stack.wait_journal(2)
    wait_until(
        lambda: stack.open_store().dead_letters(DeadLetterFilter(sources=("crm",))) != [],
        60,
        "the reused id's review row",
    )
    assert visits(stack, 7) == 2


@SQLITE
def test_a_full_shard_refuses_the_whole_delivery_and_the_retry_takes_it_whole(
    stack: Stack, tmp_path: Path
) -> None:
    # Given no worker yet, one shard that holds at most six waiting events, three waiting
    start(stack, tmp_path, worker=False, shard_count=1, shard_high_water=6)
    assert post(stack, [item(n, 90 + n) for n in range(3)]).status_code == 202
    # When a delivery brings five more (eight would be over the mark)
    delivery = [item(20 + n, 100 + n) for n in range(5)]
    answer = post(stack, delivery)
    # Then it is refused whole: 503 with Retry-After, none of it queued or marked seen
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "shard_full"
    assert "retry-after" in answer.headers
    assert queued(stack) == 3
    # When the worker drains the shard and the sender retries the same delivery
    stack.worker(lanes=4)
    wait_until(lambda: queued(stack) == 0, 60, "the shard drained", on_timeout=stack.logs)
    retried = post(stack, delivery)
    # Then every item is taken (none was marked seen by the refusal), each applied once
    assert retried.status_code == 202, retried.text
    assert [i["status"] for i in retried.json()["items"]] == ["accepted"] * 5
    stack.wait_journal(8)
    assert [visits(stack, 100 + n) for n in range(5)] == [1] * 5


@SQLITE
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"events": [{"id": "a", "who": 1}, {"who": 2}]}, 400, "missing_event_id"),
        ({"events": [{"id": "a", "who": 1}, {"id": "b"}]}, 400, "missing_record_key"),
        ({"events": [{"id": str(n), "who": n} for n in range(4)]}, 413, "too_many_items"),
    ],
)
def test_a_delivery_with_one_bad_item_is_a_4xx_naming_it_and_records_nothing(
    stack: Stack, tmp_path: Path, body: Any, status: int, code: str
) -> None:
    start(stack, tmp_path, worker=False, max_batch_items=3)
    before = stack.settled_counters()
    answer = post(stack, body, source="strict")
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == code
    if status == 400:
        assert answer.json()["detail"].startswith("item 1: ")
    assert queued(stack) == 0
    assert stack.settled_counters() == before


@SQLITE
def test_a_sender_that_waits_is_told_each_items_outcome(stack: Stack, tmp_path: Path) -> None:
    start(stack, tmp_path)
    answer = post(stack, [item(30, 40, 2), item(31, 41, 3)], prefer="wait=20")
    assert answer.status_code == 200, answer.text
    told = answer.json()
    assert told["status"] == "decided"
    assert [(i["status"], i["record_key"], i["revision"]) for i in told["items"]] == [
        ("applied", "contact:40", 1),
        ("applied", "contact:41", 1),
    ]


@SQLITE
def test_a_retry_after_the_outcomes_are_no_longer_kept_is_told_each_by_its_lane(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a deployment that keeps a told outcome one second, and a delivery applied
    start(stack, tmp_path, outcome_keep_s=1)
    delivery = [item(50, 60, 2), item(51, 61, 3)]
    assert post(stack, delivery, prefer="wait=20").json()["status"] == "decided"
    keys = stack.settings.keys
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    wait_until(
        lambda: not client.exists(keys.outcome("crm", "50"), keys.outcome("crm", "51")),
        10,
        "the told outcomes to expire",
    )
    # When it is retried, waiting and not
    for prefer in ({"prefer": "wait=20"}, {}):
        again = post(stack, delivery, **prefer)
        # Then each item is told its stored outcome again, replayed, applied once
        assert again.status_code == 200, again.text
        items = again.json()["items"]
        assert [(i["status"], i["revision"], i["replayed"]) for i in items] == [
            ("applied", 1, True),
            ("applied", 1, True),
        ]
        client.delete(keys.outcome("crm", "50"), keys.outcome("crm", "51"))
    assert (visits(stack, 60), visits(stack, 61)) == (2, 3)
    client.close()


@pytest.mark.slow
def test_on_rabbitmq_a_delivery_with_an_item_refused_is_a_503_and_its_retry_applies_each_once(
    deploy: Any,
) -> None:
    # Given RabbitMQ shard queues that hold at most two messages, no worker yet, and one
    # shard (a) full: its broker refuses one more (a quorum queue's length is checked as
    # messages come, so the refusal may come a message late)
    stack: Stack = deploy(shard_count=2, shard_high_water=2)
    stack.use_sources(SOURCES)
    stack.receiver()
    shards = stack.settings.shards
    on_a = [c for c in range(200, 400) if shards.shard_for_key(f"contact:{c}") == 0]
    on_b = next(c for c in range(200, 400) if shards.shard_for_key(f"contact:{c}") == 1)
    filled = 0
    while post(stack, [item(500 + filled, on_a[filled])]).status_code == 202:
        filled += 1
        assert filled < 10, "the shard queue never refused a publish"
    # When a delivery brings one event for each shard
    last_a = on_a[filled]  # refused above: never queued, so not yet known to keylane
    delivery = [item(600, on_b), item(601, last_a)]
    answer = post(stack, delivery)
    # Then the broker's refusal of one item refuses the delivery: a 503, no 2xx
    assert answer.status_code == 503, answer.text
    # When a worker drains the shards and the sender retries the delivery
    stack.worker(lanes=4)
    stack.wait_journal(filled, timeout_s=180)
    retried = post(stack, delivery)
    assert retried.status_code == 202, retried.text
    # Then each item is applied exactly once, though the first attempt published one of
    # them (the journal makes its second copy a duplicate)
    stack.wait_journal(filled + 2, timeout_s=180)
    assert [visits(stack, c) for c in (*on_a[: filled + 1], on_b)] == [1] * (filled + 2)
    # And a retry of it all is a duplicate of each item
    replay = post(stack, delivery)
    assert replay.status_code == 200, replay.text
    assert [i.get("replayed") for i in replay.json()["items"]] == [True, True]
