"""Fair admission across sources, through real processes: one source flooding (an
automation stuck in a loop) is slowed with 429 (or 503 past the global mark) and
Retry-After, while another source's every delivery is still accepted and applied; a
refusal records nothing, and none of the flood's accepted events is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack, event, wait_until

SOURCES = """
[sources.loop]
verify = { scheme = "none" }

[sources.bookings]
verify = { scheme = "none" }
"""


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_flooding_source_is_slowed_while_another_sources_bookings_are_taken(
    stack: Stack, tmp_path: Path
) -> None:
    # Given two sources, a global mark of 200 events (so each source's share is 100), and a
    # worker whose one lane spends 20 ms on each of the flood's events
    stack.use_sources(SOURCES, global_high_water=200)
    flood_sleep = {"point": "worker.before_write", "action": "sleep", "match": "flood:"}
    stack.worker(lanes=1, faults=[{**flood_sleep, "sleep_ms": 20}])
    stack.receiver()
    stack.wait_all_owned()
    # When the loop source sends as fast as 8 senders can
    stop = threading.Event()
    accepted: set[str] = set()
    refusals: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def flood(sender: int) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while not stop.is_set():
                event_id = f"f{sender}-{n}"
                body = event(event_id, f"flood:{n % 50}", n={"increment": 1})
                answer = stack.post(body, source="loop", client=client)
                with lock:
                    if answer.status_code == 202:
                        accepted.add(event_id)
                    else:
                        refusals.append((answer.status_code, answer.headers.get("retry-after")))
                if answer.status_code != 202:
                    time.sleep(0.05)
                n += 1

    senders = [threading.Thread(target=flood, args=(i,)) for i in range(8)]
    for thread in senders:
        thread.start()
    try:
        wait_until(lambda: len(refusals) > 0, 120, "the flood to be slowed", on_timeout=stack.logs)
        # And the bookings source sends a booking every quarter of a second meanwhile
        booked: list[Any] = []
        for n in range(20):
            answer = stack.post(event(f"b-{n}", f"slot:{n}", taken={"set": True}), "bookings")
            booked.append(answer)
            time.sleep(0.25)
        flooded_meanwhile = len(refusals)
    finally:
        stop.set()
        for thread in senders:
            thread.join()
    # Then every booking was accepted while the flood was refused, each refusal with
    # when to come back (429 past its share while bookings waited, 503 past the mark)
    assert [a.status_code for a in booked] == [202] * 20, [a.text for a in booked]
    assert {status for status, _ in refusals} <= {429, 503}
    assert 429 in {status for status, _ in refusals}
    assert all(retry_after is not None and int(retry_after) >= 1 for _, retry_after in refusals)
    assert flooded_meanwhile > 0
    # And every event accepted, of either source, is applied exactly once
    stack.wait_journal(len(accepted) + 20, timeout_s=300)
    store = stack.open_store()
    assert store.journal_size() == len(accepted) + 20
    total = sum(store.read(f"flood:{k}").fields.get("n", 0) for k in range(50))
    assert total == len(accepted)
    assert all(store.read(f"slot:{n}").fields == {"taken": True} for n in range(20))
    # And the refusals were counted, and the backlog is empty once all is applied
    counters = stack.settled_counters()
    assert counters.get("throttled", 0) + counters.get("overloaded", 0) == len(refusals)
    wait_until(lambda: stack.view().backlog() == {}, 30, "the backlog to empty")
