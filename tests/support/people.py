"""The two-door workload of the merge tests: people told by a web form (by email) and by
the CRM (by phone, then an event linking both), sent as senders send them, to keylane's
records or to a task whose records are in a CRM (``tests/support/crm_tasks.py``); shared by
``tests/test_merges.py`` and the RabbitMQ tests (``tests/test_rabbitmq_broker.py``)."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from keylane.workers.merges import live_end
from keylane.workers.store import RecordStore
from keylane.workers.store_rows import DeadLetterFilter, Record
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


def one_record(store: RecordStore, n: int) -> Record | None:
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


def streamed_in(store: RecordStore, n: int) -> bool:
    """Whether person ``n`` is one record holding every event of :func:`streamed` (the
    absorb done: a close alone already makes both keys end in one record)."""
    record = one_record(store, n)
    return (
        record is not None
        and len(record.fields.get("crm_seq", [])) == 5
        and len(record.fields.get("form_seq", [])) == 4
    )


# -- a task whose records are elsewhere -----------------------------------------------

TASK_SOURCES = """
[sources.form]
task = "sync_person"
record_key = "person:{body:email}"
also = ["email:{body:email}"]

[sources.crm]
task = "sync_person"
record_key = "person:{body:phone}"
also = ["phone:{body:phone}", "email:{body:email}"]
"""


def told_to_the_task(n: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """Person ``n`` as the task's senders tell it: the form by email (4 events), the CRM
    by phone (5, the second also naming the email), each a list the CRM appends to."""
    email, phone = person(n)
    form = [{"id": f"form-{n}-{i}", "email": email, "list": "form_seq", "n": i}
            for i in range(1, 5)]  # fmt: skip
    crm = [{"id": f"crm-{n}-{i}", "phone": phone, "list": "crm_seq", "n": i,
            **({"email": email} if i == 2 else {})}
           for i in range(1, 6)]  # fmt: skip
    return [("form", form), ("crm", crm)]


def crm_contacts(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    with sqlite3.connect(path, timeout=60) as conn:
        try:
            rows = conn.execute("SELECT key, fields FROM contacts").fetchall()
        except sqlite3.OperationalError:  # not made yet
            return {}
    return {str(key): json.loads(fields) for key, fields in rows}


def task_deployment(stack: Stack, tmp_path: Path) -> Path:
    """The CRM task's sources, app and database on ``stack``, and a receiver; the CRM's
    database file."""
    sources = tmp_path / "sources.toml"
    sources.write_text(TASK_SOURCES)
    update = {"sources_file": sources, "app": "tests.support.crm_tasks"}
    stack.settings = stack.settings.model_copy(update=update)
    crm_db = tmp_path / "crm.sqlite"
    stack.extra_env["TEST_CRM_DB"] = str(crm_db)
    stack.receiver()
    return crm_db


def post_to_the_task(stack: Stack, people: range) -> None:
    """Each sender's events of each person posted in order, every sender at once."""

    def post_in_order(source: str, bodies: list[dict[str, Any]]) -> None:
        with httpx.Client(timeout=30) as client:
            for body in bodies:
                answer = stack.post(body, source=source, client=client, retries=3)
                assert answer.status_code == 202, answer.text

    with ThreadPoolExecutor(8) as pool:
        sending = [pool.submit(post_in_order, source, bodies)
                   for n in people for source, bodies in told_to_the_task(n)]  # fmt: skip
        for done in sending:
            done.result()


def check_task_merges(stack: Stack, crm_db: Path, people: range) -> None:
    """One CRM contact per person (its survivor key) holding both senders' numbers once
    and in order; both keys' lanes end in it; on_merge ran once per person (its absorb
    journaled in the survivor's lane); every event journaled once; no dead letter."""

    def merged() -> bool:
        contacts = crm_contacts(crm_db)
        return len(contacts) == len(people) and all(
            len(c.get("form_seq", [])) == 4 and len(c.get("crm_seq", [])) == 5
            for c in contacts.values()
        )

    wait_until(merged, 120, "one contact per person in the CRM", on_timeout=stack.logs)
    store = stack.open_store()
    sent = {b["id"] for n in people for _, bodies in told_to_the_task(n) for b in bodies}
    wanted = len(sent) + 2 * len(people)  # and a close and an absorb per person
    wait_until(lambda: store.journal_size() >= wanted, 120, "every entry", on_timeout=stack.logs)
    contacts = crm_contacts(crm_db)
    for n in people:
        email, phone = person(n)
        by_email, by_phone = live_end(store, f"person:{email}"), live_end(store, f"person:{phone}")
        assert by_email.key == by_phone.key
        assert contacts[by_email.key] == {"form_seq": [1, 2, 3, 4], "crm_seq": [1, 2, 3, 4, 5]}
        absorbed = store.read(({f"person:{email}", f"person:{phone}"} - {by_email.key}).pop())
        assert absorbed.merged_into == by_email.key
        assert set(store.identities_of(by_email.key)) == {f"email:{email}", f"phone:{phone}"}
    with sqlite3.connect(crm_db) as conn:
        calls = conn.execute("SELECT survivor, absorbed FROM merges").fetchall()
    assert len(calls) == len(people), calls
    absorbs = [e for e in store.journal_entries() if e.event_id.startswith("absorb-")]
    assert sorted(e.record_key for e in absorbs) == sorted(s for s, _ in calls)
    journaled = [e.event_id for e in store.journal_entries() if e.source in ("form", "crm")]
    assert sorted(journaled) == sorted(sent)
    assert store.dead_letters(DeadLetterFilter()) == []
