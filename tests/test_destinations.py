"""Writing where the records live: user tasks and HTTP forwards, with real keylane
processes in front of real local HTTP servers (:mod:`tests.support.notion`).

Each scenario ends with exact checks: one page (one effect) per contact (event id), every
update present, in send order, nothing lost."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from keylane.routing.contract.settings import Settings
from keylane.workers.stores.base import DeadLetterFilter
from tests.support.notion import HookServer, NotionLike
from tests.support.stack import REPO, Stack, settings_env, wait_until
from tests.support.user_tasks import search_then_create

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

APP = "tests.support.user_tasks"

#: One contact's deliveries: for each update in order, how many copies are sent at once.
Plan = dict[str, list[int]]


def _configure(stack: Stack, tmp_path: Path, sources: str, **settings: Any) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(sources)
    stack.settings = stack.settings.model_copy(
        update={"sources_file": path, "app": APP, **settings}
    )


def _plan(contacts: int, seed: int) -> Plan:
    """2-5 deliveries per contact: 1-3 different updates, the rest identical retries."""
    rng = random.Random(seed)
    plan: Plan = {}
    for n in range(contacts):
        deliveries = rng.randint(2, 5)
        updates = rng.randint(1, min(3, deliveries))
        copies = [1] * updates
        for _ in range(deliveries - updates):
            copies[rng.randrange(updates)] += 1
        plan[f"c{n}@example.com"] = copies
    return plan


def _run_plan(plan: Plan, deliver: Callable[[httpx.Client, dict[str, Any]], None]) -> None:
    """Every contact at once; within a contact, each update's copies at once, and the next
    update after the previous one was answered (so send order is well defined). Each
    sending thread has its own HTTP client, as separate senders do."""
    local, clients = threading.local(), []

    def send(payload: dict[str, Any]) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=30)
            clients.append(local.client)
        deliver(local.client, payload)

    def contact(email: str) -> None:
        for seq, copies in enumerate(plan[email], 1):
            payload = {"id": f"{email}/{seq}", "email": email, "seq": seq}
            for copy in [senders.submit(send, payload) for _ in range(copies)]:
                copy.result()

    try:
        with ThreadPoolExecutor(200) as senders, ThreadPoolExecutor(50) as contacts:
            list(contacts.map(contact, plan))
    finally:
        for client in clients:
            client.close()


def _duplicates(crm: NotionLike) -> int:
    return sum(len(pages) - 1 for pages in crm.pages_by_email().values())


@SQLITE
def test_search_then_create_makes_one_page_per_contact_behind_keylane(
    stack: Stack, tmp_path: Path
) -> None:
    plan = _plan(200, seed=12)
    events = sum(len(copies) for copies in plan.values())
    # Given a Notion-like API with no unique constraint and 5-50 ms per call
    direct_crm, crm = NotionLike(seed=1).start(), NotionLike(seed=2).start()
    try:
        # When the workload goes straight at it from a thread pool
        started = time.monotonic()
        _run_plan(plan, lambda client, p: search_then_create(client, direct_crm.url, p))
        direct = _duplicates(direct_crm)
        print(f"\ndirect: {time.monotonic() - started:.1f}s")
        # And the same workload goes through keylane: a source whose task searches, then
        # creates or appends
        _configure(
            stack,
            tmp_path,
            '[sources.crm]\ntask = "sync_contact"\nrecord_key = "contact:{body:email}"\n',
        )
        stack.extra_env["TEST_CRM_URL"] = crm.url
        stack.worker(lanes=16)
        stack.receiver()
        stack.wait_all_owned()
        started = time.monotonic()
        _run_plan(plan, lambda client, p: _post_ok(stack, client, p))
        print(f"sent: {time.monotonic() - started:.1f}s")
        stack.wait_journal(events)
        print(f"applied: {time.monotonic() - started:.1f}s")
        pages = crm.pages_by_email()
        print(
            f"\nrace: {len(plan)} contacts, {sum(map(sum, plan.values()))} deliveries; "
            f"duplicate pages straight from a thread pool: {direct}, behind keylane: "
            f"{_duplicates(crm)}"
        )
        # Then keylane made exactly one page per contact, holding every update in order
        assert {email: len(p) for email, p in pages.items()} == dict.fromkeys(plan, 1)
        for email, copies in plan.items():
            assert pages[email][0]["updates"] == list(range(1, len(copies) + 1)), email
        # While the thread pool made duplicates of the same workload
        assert direct > 0
        assert stack.open_store().journal_size() == events
    finally:
        direct_crm.stop()
        crm.stop()


def _post_ok(stack: Stack, client: httpx.Client, payload: dict[str, Any]) -> None:
    answer = stack.post(payload, source="crm", client=client, retries=3)
    assert answer.status_code in (200, 202), answer.text
