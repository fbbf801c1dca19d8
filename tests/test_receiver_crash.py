"""Invariant 1 under a receiver crash: a 2xx means durably enqueued, and a failure to
enqueue leaves nothing that would swallow the sender's retry."""

from __future__ import annotations

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
