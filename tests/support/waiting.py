"""Senders waiting for outcomes while their receiver is killed: shared by the Redis test
(``tests/test_outcomes.py``) and the RabbitMQ one (``tests/test_rabbitmq_broker.py``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.stack import Stack, event, wait_until


def restart_under_500_waiting(stack: Stack) -> None:
    """500 senders wait for their outcomes (``Prefer: wait``) while the receiver is
    killed -9 under them; they retry against a restarted one, a worker running now:
    every answer is a 202 or its own event's true outcome, each event applied once."""
    # Given a receiver, and no worker yet: nothing is decided while the senders wait
    receiver = stack.receiver()
    url = stack.url
    events = [event(f"r-{n}", f"restart:{n}", n={"increment": 1}) for n in range(500)]
    answers: dict[int, httpx.Response | None] = {}
    client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=600))

    def deliver(n: int, base: str) -> None:
        try:
            answers[n] = stack.post(events[n], url=base, client=client, prefer="wait=20")
        except httpx.TransportError:
            answers[n] = None

    # When 500 senders wait at once and the receiver is killed -9 under them
    with ThreadPoolExecutor(500) as pool:
        futures = [pool.submit(deliver, n, url) for n in range(500)]
        wait_until(lambda: accepted_count(stack) >= 500, 30, "500 deliveries accepted")
        receiver.kill()
        for f in futures:
            f.result()
    lost = [n for n, a in answers.items() if a is None]
    assert len(lost) == 500  # none was answered before its outcome was known
    # And the senders retry against a restarted receiver, a worker running now
    stack.worker(lanes=16)
    stack.receiver()
    if not stack.settings.broker_is_rabbitmq:  # there a worker owns what it consumes
        stack.wait_all_owned()
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(lambda n: deliver(n, stack.url), lost))
    # Then every answer is a 202 or its own event's true outcome
    store = stack.open_store()
    stack.wait_journal(500)
    told = 0
    for n, answer in answers.items():
        assert answer is not None, n
        assert answer.status_code in (200, 202), (n, answer)
        body = answer.json()
        if body["status"] == "applied":
            told += 1
            entry = store.journal("demo", f"r-{n}")
            assert entry is not None
            assert (body["event_id"], body["record_key"]) == (f"r-{n}", f"restart:{n}")
            assert body["revision"] == entry.revision == 1
    # And each event was applied once, most told while their senders waited
    assert all(store.read(f"restart:{n}").fields == {"n": 1} for n in range(500))
    assert told > 250, told
    client.close()


def accepted_count(stack: Stack) -> int:
    """The deployment's ``accepted`` counter (as its receivers last wrote it)."""
    counters = stack.view().client.hgetall(stack.settings.keys.counters)
    return int(counters.get(b"accepted", 0))
