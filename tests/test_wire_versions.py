"""Versions of the wire format and of the Redis layout (routing/contract/wire.py): what each
version carries, what a producer writes beside workers of an older release, and what a
worker does with a message of a version it does not read (parks it whole, holds its
record, never drops it)."""

from __future__ import annotations

import ast
import json
import time
from typing import Any

import httpx
import pytest
import redis

from keylane.routing.contract import wire
from keylane.routing.contract.events import WIRE_DEFAULTS, Event
from keylane.routing.contract.message import event_message, parse_message
from keylane.routing.contract.settings import Settings
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.releases import git, release_commit
from tests.support.stack import Stack, event, wait_until

SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def _wire_event(record_key: str = "contact:1", event_id: str = "e-1") -> dict[str, Any]:
    return Event(
        source="demo",
        event_id=event_id,
        event_type="t",
        record_key=record_key,
        changes={},
        body_sha256="0" * 64,
        accepted_at=time.time(),
        shard=0,
    ).model_dump(mode="json")


def test_every_field_of_an_event_says_its_wire_version() -> None:
    # A field added to Event without a version would reach workers of an older release,
    # whose model forbids unknown fields: every event a `malformed` dead letter there.
    assert set(Event.model_fields) == wire.V1_FIELDS | set(wire.FIELDS_SINCE)
    assert all(1 < since <= wire.WIRE_VERSION for since in wire.FIELDS_SINCE.values())
    assert tuple(range(1, wire.WIRE_VERSION + 1)) == wire.READS


def test_version_1_is_the_event_of_the_previous_release() -> None:
    # Given the event model of keylane 0.1.0, read from this repository's history
    commit = release_commit()
    if commit is None:
        pytest.skip("this clone has no history of the previous release (44bfee1)")
    shown = git("show", f"{commit}:routing/contract/events.py")
    assert shown.returncode == 0, shown.stderr
    tree = ast.parse(shown.stdout)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Event")
    fields = {
        node.target.id
        for node in model.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    } - {"model_config"}
    # Then version 1 is exactly its fields
    assert fields == wire.V1_FIELDS


def test_an_event_is_written_for_an_older_version_without_the_fields_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a field that wire version 2 added (as a later release adds one)
    monkeypatch.setattr(wire, "FIELDS_SINCE", {"priority": 2})
    defaults = {**WIRE_DEFAULTS, "priority": None}
    unused = {**_wire_event(), "priority": None}
    used = {**_wire_event(), "priority": 5}
    # Then for version 1 an event that leaves it at its default is written without it
    assert "priority" not in wire.for_version(unused, 1, defaults)
    assert wire.for_version(unused, 2, defaults) is unused
    # And one that uses it cannot be written for version 1: a 503 until workers upgrade
    with pytest.raises(wire.NeedsNewerWire, match="priority"):
        wire.for_version(used, 1, defaults)
    assert wire.for_version(used, 2, defaults) == used


def test_an_event_goes_to_an_older_worker_without_its_delivery_rather_than_wait() -> None:
    # Given an event that names its delivery and carries its request (wire version 2)
    kept = {**_wire_event(), "delivery": "crm/1-1099511627776", "request": {"method": "POST"}}
    # Then for a worker of 0.1.0 (version 1) it is written without them (kept only, they
    # change no outcome), never refused with a 503
    older = wire.for_version(kept, 1, WIRE_DEFAULTS)
    assert "delivery" not in older
    assert "request" not in older
    assert wire.for_version(kept, 2, WIRE_DEFAULTS) is kept


def test_a_message_names_its_version_from_2_on() -> None:
    for version in (1, 2, 3):
        message = parse_message(event_message(_wire_event(), "q", wire=version))
        assert ("keylane_wire" in message.headers) == (version > 1)
        assert wire.version_of(message.headers) == version
    assert wire.version_of({"keylane_wire": "2"}) is None  # not a version: no one reads it
    assert wire.wire_of_member({"host": "h", "pid": 1}) == 1  # a 0.1.0 worker's beat
    assert wire.wire_of_member({"wire": 2}) == 2


def _beat(client: redis.Redis, settings: Settings, worker: str, info: dict[str, Any]) -> None:
    """A worker's membership beat as every release writes it (0.1.0's info names no wire
    version)."""
    keys = settings.keys
    client.zadd(keys.members, {worker: int(time.time() * 1000) + 600_000})
    client.hset(keys.member(worker), mapping={"info": json.dumps(info)})


def _queued_versions(client: redis.Redis, settings: Settings, shard: int) -> list[int | None]:
    queue = settings.keys.queue(settings.shards.queue_name(shard))
    return [wire.version_of(parse_message(raw).headers) for raw in client.lrange(queue, 0, -1)]


def _gauge(stack: Stack) -> float:
    for line in httpx.get(f"{stack.ops_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("keylane_wire_version "):
            return float(line.split()[1])
    raise AssertionError("no keylane_wire_version")


@SQLITE
def test_a_receiver_writes_the_version_the_oldest_live_worker_reads(stack: Stack) -> None:
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    try:
        # Given a live worker of keylane 0.1.0 (its beat names no wire version) and one of
        # this release, and a receiver of this release (no worker consumes: the queue
        # keeps what the receiver wrote)
        _beat(client, stack.settings, "old:1:a", {"host": "h", "pid": 1, "lanes": 4})
        _beat(client, stack.settings, "new:2:b", {"host": "h", "pid": 2, "wire": 2})
        stack.receiver()
        # When it accepts an event
        answer = stack.post(event("w-1", "contact:1", visits={"increment": 1}))
        assert answer.status_code == 202, answer.text
        shard = answer.json()["shard"]
        # Then it wrote version 1, which the old worker reads, and says so
        assert _queued_versions(client, stack.settings, shard) == [1]
        assert _gauge(stack) == 1
        # When the old worker has left
        client.zrem(stack.settings.keys.members, "old:1:a")
        # Then, once it has read the members again, it writes version 2
        wait_until(lambda: _gauge(stack) == 2, 30, "the receiver to write version 2")
        answer = stack.post(event("w-2", "contact:1", visits={"increment": 1}))
        assert answer.status_code == 202
        assert _queued_versions(client, stack.settings, shard) == [2, 1]
    finally:
        client.close()


@SQLITE
def test_a_message_of_a_newer_version_is_parked_whole_holds_its_record_and_is_never_dropped(
    stack: Stack,
) -> None:
    # Given a worker and a receiver, and contact:1 with one event applied
    stack.worker()
    stack.receiver()
    stack.wait_all_owned()
    assert stack.post(event("a-1", "contact:1", seq={"append": 1})).status_code == 202
    stack.wait_journal(1)
    # When a message of wire version 3 (a newer keylane's) for contact:1 arrives, then
    # another event for it, and events for another record
    s = stack.settings
    shard = s.shards.shard_for_key("contact:1")
    newer = {**_wire_event("contact:1", "n-2"), "shard": shard}
    newer["changes"] = {"seq": {"append": 2}}
    raw = event_message(newer, s.shards.queue_name(shard), wire=3)
    client = redis.Redis.from_url(s.redis_dsn())
    try:
        client.lpush(s.keys.queue(s.shards.queue_name(shard)), raw)
    finally:
        client.close()
    assert stack.post(event("a-3", "contact:1", seq={"append": 3})).status_code == 202
    for n in range(5):
        assert stack.post(event(f"b-{n}", "contact:2", seq={"append": n})).status_code == 202
    store = stack.open_store()
    # Then the other record's events apply
    wait_until(lambda: store.read("contact:2").fields.get("seq") == list(range(5)), 60, "b")
    # And the newer message is a review row that keeps it whole, naming its version
    rows = store.dead_letters(DeadLetterFilter(reasons=("wire_version",)))
    assert len(rows) == 1, rows
    row = rows[0]
    assert row.record_key == "contact:1"
    assert row.event["raw"].encode() == raw
    assert row.event["wire"] == 3
    assert "wire version 3" in row.error
    # And its record is held behind it: the later event waits, in order
    time.sleep(2)
    assert store.read("contact:1").fields["seq"] == [1]
    # When an operator retries it with no worker that reads version 3
    done = stack.keylane("dlq", "retry", str(row.id), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr

    # Then it is parked again, whole (a row of its own), never applied nor dropped
    def parked_again() -> list[Any]:
        found = store.dead_letters(DeadLetterFilter(reasons=("wire_version",)))
        return [r for r in found if r.id != row.id]

    wait_until(lambda: bool(parked_again()), 60, "the retried message to be parked again")
    again = parked_again()[0]
    assert parse_message(again.event["raw"].encode()).kwargs == parse_message(raw).kwargs
    assert store.read("contact:1").fields["seq"] == [1]
    # And when it is discarded, the record goes on with its next event
    done = stack.keylane("dlq", "discard", str(again.id), "--yes", "--note", "test")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until(lambda: store.read("contact:1").fields["seq"] == [1, 3], 60, "a-3 to apply")
