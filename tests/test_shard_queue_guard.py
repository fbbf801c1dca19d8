"""keylane's shard queues are consumed by its lanes only: a plain Celery consumer (started
by hand, or added with Flower's "Add consumer") neither applies nor loses a message."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from keylane.routing.contract.events import Change, Event
from keylane.routing.contract.message import build_event_message, parse_message
from keylane.routing.contract.settings import Settings
from keylane.workers.app import create_app
from tests.support.stack import Stack, event, wait_until

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def test_a_plain_celery_worker_gives_shard_messages_back(settings: Settings) -> None:
    # Given keylane's own Celery app run as a plain Celery worker on shard queue 0
    app = create_app(settings)
    queue = settings.shards.queue_name(0)
    ev = Event(
        source="demo",
        event_id="g-1",
        event_type="t",
        record_key="k",
        changes={"n": Change(op="increment", value=1)},
        body_sha256="0" * 64,
        accepted_at=time.time(),
        shard=0,
    )
    client = redis.Redis.from_url(settings.redis_dsn())
    key = settings.keys.queue(queue)
    client.lpush(key, build_event_message(ev, queue))
    ignored = threading.Event()
    from celery.signals import task_postrun

    def on_postrun(sender: object = None, state: str | None = None, **_: object) -> None:
        if state == "IGNORED":
            ignored.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        with start_worker(
            app, pool="solo", queues=[queue], perform_ping_check=False, shutdown_timeout=10
        ):
            # When it takes the message
            assert ignored.wait(20)
    finally:
        task_postrun.disconnect(on_postrun)
    # Then the message is back in the shard queue, the same event, for the lane
    wait_until(lambda: client.llen(key) >= 1, 10, "the message back in the queue")
    back = [parse_message(raw).kwargs["event"]["event_id"] for raw in client.lrange(key, 0, -1)]
    assert set(back) == {"g-1"}
    client.close()


def test_add_consumer_on_a_shard_queue_is_refused(stack: Stack) -> None:
    # Given a running keylane worker
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    app = create_app(stack.settings)
    # (remote control is a broadcast: wait until the worker's mailbox listens)
    wait_until(lambda: bool(app.control.ping(timeout=0.5)), 20, "the worker to answer a ping")
    queue = stack.settings.shards.queue_name(3)
    # When Flower (or anyone) asks it to consume a shard queue with Celery's consumer
    replies = app.control.add_consumer(queue, reply=True, timeout=5)
    # Then it refuses, and events keep flowing through the lanes only
    assert replies, "the worker answered"
    assert all("error" in next(iter(r.values())) for r in replies), replies
    ok = app.control.add_consumer("some.other.queue", reply=True, timeout=5)
    assert all("ok" in next(iter(r.values())) for r in ok), ok
    key = next(
        k for k in (f"k:{n}" for n in range(500)) if stack.settings.shards.shard_for_key(k) == 3
    )
    assert stack.post(event("c-1", key, n={"increment": 1})).status_code == 202
    stack.wait_journal(1)
    assert stack.open_store().read(key).fields == {"n": 1}
    app.close()
