"""Invariant 1 under a receiver crash: a 2xx means durably enqueued, and a failure to
enqueue leaves nothing that would swallow the sender's retry."""

from __future__ import annotations

import time

import httpx
import pytest

from keylane.routing.contract.settings import FaultSpec
from tests.support.stack import Stack, event


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("point", ["receiver.before_enqueue", "receiver.after_enqueue"])
def test_receiver_killed_mid_delivery_then_retry_applies_once(stack: Stack, point: str) -> None:
    # Given a worker, and a receiver that will be killed (SIGKILL) at `point`
    stack.worker(lanes=2)
    faulty = stack.receiver(
        faults=[FaultSpec(point=point, action="kill", match="crash:").model_dump()]
    )
    stack.wait_all_owned()
    delivery = event("c-1", "crash:1", n={"increment": 7})
    # When the sender delivers, the receiver dies before answering
    with pytest.raises(httpx.TransportError):
        stack.post(delivery)
    faulty.process.wait(10)  # type: ignore[union-attr]
    assert not faulty.alive()
    # And the sender retries against a restarted receiver
    stack.receiver()
    retry = stack.post(delivery)
    # Then the retry is accepted: 202 if the first never reached Redis, 200 if it did
    assert retry.status_code == (202 if point == "receiver.before_enqueue" else 200), retry.text
    stack.wait_journal(1)
    # And the event was applied exactly once
    store = stack.open_store()
    assert store.read("crash:1").fields == {"n": 7}
    assert store.journal_size() == 1
    # And a third delivery is a duplicate with no effect
    assert stack.post(delivery).status_code == 200
    assert store.read("crash:1").revision == 1


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_receiver_stops_on_sigterm_within_seconds_every_time(stack: Stack) -> None:
    # Given a receiver that has just accepted deliveries (its queue watch polling Redis),
    # stopped 15 times at moments that fall anywhere in the watch's poll (it once took a
    # cancel inside a Redis read for a failed poll and polled on: 6 stops in 25 hung)
    for n in range(15):
        receiver = stack.receiver()
        with httpx.Client(timeout=10) as client:
            for i in range(5):
                body = event(f"stop-{n}-{i}", f"stop:{i}", n={"increment": 1})
                assert stack.post(body, client=client).status_code == 202
        time.sleep(n % 3 * 0.4)
        # When it is sent SIGTERM, Then it exits, cleanly, well before a supervisor's kill
        started = time.monotonic()
        code = receiver.stop(timeout_s=10)
        took_s = time.monotonic() - started
        assert code == 0, (n, code, receiver.log()[-2000:])
        assert took_s < 8, (n, took_s, receiver.log()[-2000:])
