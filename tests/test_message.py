"""The messages keylane pushes are ordinary Celery task messages: a real Celery worker,
consuming a shard queue, runs them."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from keylane.routing.contract.events import Change, Event
from keylane.routing.contract.message import build_event_message, parse_message
from keylane.routing.contract.settings import Settings
from keylane.routing.router import EVENT_TASK
from keylane.workers.brokers.choice import broker_options


def _event() -> Event:
    return Event(
        source="demo",
        event_id="m-1",
        event_type="t",
        record_key="contact:1",
        changes={"n": Change(op="increment", value=3)},
        body_sha256="0" * 64,
        accepted_at=time.time(),
        shard=0,
    )


def test_message_round_trips_through_our_parser() -> None:
    original = _event()
    message = parse_message(build_event_message(original, "keylane.shard.00", task_id="t-1"))
    assert message.task_id == "t-1"
    assert message.task_name == EVENT_TASK
    assert Event.model_validate(message.kwargs["event"]) == original


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_real_celery_worker_runs_a_pushed_message(settings: Settings) -> None:
    # Given a Celery app on the same broker and namespace, with a recording keylane.apply
    app = Celery("compat", broker=settings.redis_dsn(), set_as_current=False)
    app.conf.update(
        broker_transport_options=broker_options(settings),
        task_ignore_result=True,
        result_backend=None,
    )
    seen: list[dict[str, object]] = []
    done = threading.Event()

    @app.task(name=EVENT_TASK, shared=False)
    def apply(event: dict[str, object]) -> None:
        seen.append(event)
        done.set()

    @app.task(name="celery.ping", shared=False)
    def ping() -> str:
        return "pong"

    queue = settings.shards.queue_name(0)
    # When keylane's bytes are pushed onto the shard queue the way the receiver does
    client = redis.Redis.from_url(settings.redis_dsn())
    client.lpush(settings.keys.queue(queue), build_event_message(_event(), queue))
    client.close()
    with start_worker(
        app, pool="solo", queues=[queue], perform_ping_check=False, shutdown_timeout=10
    ):
        # Then the Celery worker decodes it and runs the task with the event
        assert done.wait(20)
    assert seen[0]["event_id"] == "m-1"
    assert seen[0]["changes"] == {"n": {"op": "increment", "value": 3}}
