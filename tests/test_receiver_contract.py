"""The receiver's answers (the external contract), over real HTTP against a real receiver
process: every 4xx changes nothing in Redis or the store."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import delete_namespace, fast_settings
from tests.support.stack import Stack, event


def _snapshot(stack: Stack) -> dict[str, Any]:
    """Every key of the namespace with its type and size, plus the store's contents."""
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    keys: dict[str, Any] = {}
    ignored = (":members", ":member:", ":lease:", ":_kombu", ":unacked")
    for raw in client.scan_iter(match=f"{stack.settings.namespace}:*"):
        key = raw.decode()
        if any(part in key for part in ignored):
            continue  # heartbeats move by themselves
        kind = client.type(raw).decode()
        size = {
            "list": client.llen,
            "hash": client.hlen,
            "zset": client.zcard,
            "stream": client.xlen,
        }.get(kind)
        keys[key] = (kind, size(raw) if size else client.get(raw))
    client.close()
    store = stack.open_store()
    return {
        "redis": keys,
        "journal": store.journal_size(),
        "records": store.record_keys(limit=1000),
    }


@pytest.fixture(scope="module")
def running(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One deployment for the module's tests: each compares the state before and after
    its own request, so they need not start from scratch."""
    tmp = tmp_path_factory.mktemp("contract")
    ns = f"kltest-{uuid.uuid4().hex[:10]}"
    stack = Stack(
        fast_settings(redis_url, ns, f"sqlite:///{tmp / 'store.sqlite3'}", tmp / "data"), tmp
    )
    try:
        stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned()
        # one accepted event, so the snapshot has something to compare
        assert stack.post(event("seed", "contact:1", n={"increment": 1})).status_code == 202
        stack.wait_journal(1)
        yield stack
    finally:
        stack.stop_all()
        delete_namespace(redis_url, ns)


BAD_INPUT = [
    pytest.param(b"{not json", {}, 400, "malformed_json", id="malformed-json"),
    pytest.param(
        json.dumps({"id": "e1", "changes": {"a": {"set": 1}}}).encode(),
        {},
        400,
        "invalid",
        id="missing-record-key",
    ),
    pytest.param(
        json.dumps(event("e2", "k:1", a={"multiply": 2})).encode(),
        {},
        400,
        "invalid",
        id="unknown-operation",
    ),
    pytest.param(
        json.dumps(event("e3", "k:1", a={"increment": "x"})).encode(),
        {},
        400,
        "invalid",
        id="increment-of-text",
    ),
    pytest.param(json.dumps(event("e4", "k:1")).encode(), {}, 400, "invalid", id="no-changes"),
    pytest.param(json.dumps([1, 2]).encode(), {}, 400, "invalid", id="not-an-object"),
    pytest.param(b"[" * 100 + b"]" * 100, {}, 400, "too_deep", id="too-deep"),
    pytest.param(
        b'{"id": "e5", "record_key": "k", "changes": {"a": {"set": "' + b"x" * (2 << 20) + b'"}}}',
        {},
        413,
        "too_large",
        id="2MB-body",
    ),
    pytest.param(
        json.dumps(event("e6", "k:1", a={"set": 1})).encode(),
        {"content-type": "text/plain"},
        415,
        "unsupported_media_type",
        id="text-plain",
    ),
    pytest.param(
        json.dumps(event("e7", "k:1", a={"set": 1})).encode(),
        {"content-type": ""},
        415,
        "unsupported_media_type",
        id="no-media-type",
    ),
]


@pytest.mark.parametrize(("body", "headers", "status", "code"), BAD_INPUT)
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(
    running: Stack, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    # Given a running deployment and a snapshot of its state
    before = _snapshot(running)
    # When a bad delivery arrives
    answer = httpx.post(
        f"{running.url}/webhooks/demo",
        content=body,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )
    # Then it gets the right 4xx with a JSON body that says what is wrong
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == code
    assert answer.json()["detail"]
    # And nothing changed: no queue entry, no dedupe mark, no record, no journal entry
    assert _snapshot(running) == before


def test_unknown_source_is_404_and_changes_nothing(running: Stack) -> None:
    before = _snapshot(running)
    answer = running.post(event("x1", "k:1", a={"set": 1}), source="nosuchsource")
    assert answer.status_code == 404
    assert answer.json()["error"] == "unknown_source"
    assert _snapshot(running) == before


def test_accept_duplicate_and_reuse_answers(running: Stack) -> None:
    # When an event is delivered, then again, then with the same id and another body
    first = running.post(event("d1", "contact:9", n={"increment": 2}))
    again = running.post(event("d1", "contact:9", n={"increment": 2}))
    reused = running.post(event("d1", "contact:9", n={"increment": 50}))
    reused_again = running.post(event("d1", "contact:9", n={"increment": 50}))
    # Then: 202 with event id, record key and shard; 200 replaying it; 409 (twice)
    assert first.status_code == 202
    body = first.json()
    assert body["event_id"] == "d1"
    assert body["record_key"] == "contact:9"
    assert body["shard"] == running.settings.shards.shard_for_key("contact:9")
    assert again.status_code == 200
    assert again.json() == body
    assert again.headers["keylane-replayed"] == "true"
    assert reused.status_code == 409
    assert reused.json()["error"] == "id_reused"
    assert reused_again.status_code == 409
    # And the record got the first body once, and the reuse is one review row
    running.wait_journal(2)
    store = running.open_store()
    from keylane.workers.stores.base import DeadLetterFilter
    from tests.support.stack import wait_until

    wait_until(
        lambda: len(store.dead_letters(DeadLetterFilter(reasons=("id_reused",)))) == 1,
        10,
        "the reuse review row",
    )
    assert store.read("contact:9").fields["n"] == 2
    row = store.dead_letters(DeadLetterFilter(reasons=("id_reused",)))[0]
    assert row.event_id == "d1"
    assert row.attempted_change == {"n": {"increment": 50}}


def test_health_and_readiness(running: Stack) -> None:
    assert httpx.get(f"{running.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{running.url}/readyz").json() == {"status": "ready"}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_broker_down_is_503_with_retry_after(stack: Stack) -> None:
    # Given a receiver whose Redis is unreachable
    stack.settings = stack.settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0"}
    )  # nothing listens on port 1
    stack.receiver()
    # When a delivery arrives, then it is refused with 503 and Retry-After
    answer = stack.post(event("b1", "k:1", a={"set": 1}))
    assert answer.status_code == 503
    assert answer.json()["error"] == "broker_unavailable"
    assert int(answer.headers["retry-after"]) > 0
    assert httpx.get(f"{stack.url}/readyz").status_code == 503
