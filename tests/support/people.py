"""The two-door workload of the merge tests: people told by a web form (by email) and by
the CRM (by phone, then an event linking both), sent as senders send them; shared by
``tests/test_merges.py`` and the RabbitMQ tests (``tests/test_rabbitmq_broker.py``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from keylane.workers.merges import live_end
from keylane.workers.store import Record, Store
from tests.support.stack import Stack, wait_until


def person(n: int) -> tuple[str, str]:
    return f"p{n:03d}@example.com", f"+1555010{n:04d}"


def form_events(n: int) -> list[dict[str, Any]]:
    """What a web form sends about person ``n``: named by email."""
    email, _ = person(n)
    key, also = f"person:{email}", [f"email:{email.upper()}"]
    return [
        {"id": f"form-{n}-1", "record_key": key, "also": also,
         "changes": {"name": {"set": f"Person {n}"}, "email": {"set": email},
                     "form_seq": {"append": 1}}},
        {"id": f"form-{n}-2", "record_key": key, "changes": {"form_seq": {"append": 2}}},
    ]  # fmt: skip


def crm_events(n: int, company: str | None = None) -> list[dict[str, Any]]:
    """What the CRM sends about person ``n``: named by phone, and a third event that links
    the phone to the email."""
    email, phone = person(n)
    key, also = f"person:{phone}", [f"phone:{phone}"]
    return [
        {"id": f"crm-{n}-1", "record_key": key, "also": also,
         "changes": {"phone": {"set": phone}, "company": {"set": company or f"Co {n % 7}"},
                     "crm_seq": {"append": 1}}},
        {"id": f"crm-{n}-2", "record_key": key, "changes": {"crm_seq": {"append": 2}}},
        {"id": f"crm-{n}-3", "record_key": key, "also": [*also, f"email:{email}"],
         "changes": {"email": {"set": email}, "crm_seq": {"append": 3}}},
    ]  # fmt: skip


def send_in_order(stack: Stack, sequences: list[list[dict[str, Any]]], senders: int) -> None:
    """Each sequence posted in order by one sender; the sequences all at once."""

    def run(sequence: list[dict[str, Any]]) -> None:
        with httpx.Client(timeout=30) as client:
            for body in sequence:
                answer = stack.post({"type": "test", **body}, client=client, retries=3)
                assert answer.status_code == 202, answer.text

    with ThreadPoolExecutor(senders) as pool:
        for done in [pool.submit(run, sequence) for sequence in sequences]:
            done.result()


def one_record(store: Store, n: int) -> Record | None:
    email, phone = person(n)
    by_email = live_end(store, f"person:{email}")
    by_phone = live_end(store, f"person:{phone}")
    return by_email if by_email.key == by_phone.key else None


def streamed(n: int) -> list[list[dict[str, Any]]]:
    """Person ``n``'s events: the form's four (email) and the CRM's five (phone, linking
    both at its second), so events of both keys come before, during and after the merge."""
    email, phone = person(n)
    by_email, by_phone = f"person:{email}", f"person:{phone}"
    form = [
        {"id": f"form-{n}-{i}", "record_key": by_email, "also": [f"email:{email}"],
         "changes": {"form_seq": {"append": i}}}
        for i in range(1, 5)
    ]  # fmt: skip
    crm = [
        {"id": f"crm-{n}-{i}", "record_key": by_phone,
         "also": [f"phone:{phone}", *([f"email:{email}"] if i == 2 else [])],
         "changes": {"crm_seq": {"append": i}}}
        for i in range(1, 6)
    ]  # fmt: skip
    return [form, crm]


def kill_during_merges(stack: Stack, point: str, people: range) -> None:
    """A receiver and a worker that dies (kill -9) at ``point`` of the first merge it
    runs; ``people``'s events (:func:`streamed`) sent meanwhile, every sender in its own
    order; a second worker started once the first is gone."""
    kill = {"point": point, "action": "kill", "match": "person:", "times": 1}
    doomed = stack.worker(lanes=4, faults=[kill])
    stack.receiver()
    if not stack.settings.broker_is_rabbitmq:  # there a worker owns a shard once it consumes
        stack.wait_all_owned()
    sequences = [seq for n in people for seq in streamed(n)]
    with ThreadPoolExecutor(1) as background:
        sending = background.submit(send_in_order, stack, sequences, 8)
        wait_until(lambda: not doomed.alive(), 90, f"the kill at {point}", on_timeout=stack.logs)
        stack.worker(lanes=4)
        sending.result()


def streamed_in(store: Store, n: int) -> bool:
    """Whether person ``n`` is one record holding every event of :func:`streamed` (the
    absorb done: a close alone already makes both keys end in one record)."""
    record = one_record(store, n)
    return (
        record is not None
        and len(record.fields.get("crm_seq", [])) == 5
        and len(record.fields.get("form_seq", [])) == 4
    )
