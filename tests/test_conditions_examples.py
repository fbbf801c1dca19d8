"""The three examples of ops/docs/conditions.md, run as written (read from the page) against
a real receiver and real workers, on both stores: the booking form, the last item in
stock, invoice numbers. The outcomes are read back from the store's journal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from keylane.workers.store import DeadLetterFilter, Store
from tests.support.readme import page_block
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow
PAGE = "conditions.md"


def _start(stack: Stack, workers: int) -> None:
    """A receiver and ``workers`` worker processes, every shard owned."""
    stack.receiver()
    for _ in range(workers):
        stack.worker(lanes=16)
    stack.wait_all_owned(workers=workers)


def _run(stack: Stack, tmp_path: Path, first_line: str) -> str:
    """Run the page's script that starts with ``first_line`` against the stack's receiver."""
    script = tmp_path / "example.py"
    script.write_text(page_block(PAGE, first_line))
    env = {"RECEIVER_URL": stack.url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _outcomes(store: Store, prefix: str) -> dict[str, str]:
    return {e.event_id: e.outcome for e in store.journal_entries() if e.event_id.startswith(prefix)}


def test_the_booking_form_books_each_slot_once_and_refuses_the_other_client(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver and a worker
    _start(stack, workers=1)
    _book_50_slots_twice(stack, tmp_path)


def test_on_rabbitmq_the_booking_form_books_each_slot_once(deploy: Any, tmp_path: Path) -> None:
    # Given a receiver and two workers on RabbitMQ
    stack: Stack = deploy()
    stack.receiver()
    for _ in range(2):
        stack.worker(lanes=16)
    _book_50_slots_twice(stack, tmp_path)


def _book_50_slots_twice(stack: Stack, tmp_path: Path) -> None:
    # When two clients race for each of 50 slots (the page's script, as written)
    assert _run(stack, tmp_path, "# booking.py").strip() == "100 accepted"
    stack.wait_journal(100)
    # Then 50 bookings applied and 50 refused: one per slot each
    store = stack.open_store()
    outcomes = _outcomes(store, "book-")
    assert sorted(outcomes.values()).count("applied") == 50
    assert sorted(outcomes.values()).count("refused") == 50
    for slot in range(50):
        ada, bob = outcomes[f"book-{slot}-ada"], outcomes[f"book-{slot}-bob"]
        assert {ada, bob} == {"applied", "refused"}
        winner = "ada" if ada == "applied" else "bob"
        # And no booking was overwritten: the owner is the client whose event applied
        record = store.read(f"slot:{slot}")
        assert (record.fields, record.revision) == ({"owner": winner}, 1)
        loser = store.journal("demo", f"book-{slot}-{'bob' if winner == 'ada' else 'ada'}")
        assert loser is not None
        assert loser.result is not None
        assert (loser.result["seen"], loser.result["field"]) == (winner, "owner")
        assert loser.result["condition"] == {"owner": {"absent": True}}
        assert loser.result["revision"] == 1
    # And refusals are no dead letters, and are counted
    assert store.dead_letters(DeadLetterFilter()) == []
    assert stack.view().counters().get("refused") == 50


def test_the_last_item_is_sold_once_and_stock_never_goes_below_zero(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver and a worker
    _start(stack, workers=1)
    # When a web and a marketplace order arrive at once for each of 100 items in stock 1
    assert _run(stack, tmp_path, "# last_item.py").strip() == "200 orders accepted"
    stack.wait_journal(300)
    # Then each item is at 0, and exactly one of its orders applied, the other refused
    store = stack.open_store()
    outcomes = _outcomes(store, "order-")
    for item in range(100):
        assert store.read(f"item:{item}").fields == {"stock": 0}
        pair = {outcomes[f"order-{item}-web"], outcomes[f"order-{item}-marketplace"]}
        assert pair == {"applied", "refused"}
    refused = [e for e in store.journal_entries() if e.outcome == "refused"]
    assert len(refused) == 100
    assert {e.result["why"] for e in refused if e.result} == {"stock is 0, not >= 1"}


def test_invoice_numbers_are_1_to_200_once_each_and_a_retry_gets_no_second_number(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver and two workers (on SQLite, which takes one writer process, one)
    url = stack.settings.store_url
    _start(stack, workers=2 if url and url.get_secret_value().startswith("postgresql") else 1)
    # When 200 requests ask for the next number at once (the page's script, as written)
    assert _run(stack, tmp_path, "# invoices.py").strip() == "200 accepted"
    stack.wait_journal(200)
    # Then the journal's results carry 1..200, no gap, no repeat
    store = stack.open_store()
    entries = [e for e in store.journal_entries() if e.event_id.startswith("invoice-")]
    numbers = sorted(e.result["fields"]["number"] for e in entries if e.result)
    assert numbers == list(range(1, 201))
    assert store.read("counter:invoices").fields == {"number": 200}
    # When a request is sent again with the same id
    first = store.journal("demo", "invoice-17")
    again = {
        "id": "invoice-17",
        "record_key": "counter:invoices",
        "changes": {"number": {"increment": 1}},
    }
    # (as the script sends it: httpx's JSON, the same bytes)
    assert httpx.post(f"{stack.url}/webhooks/demo", json=again, timeout=30).status_code == 200
    # Then it gets no second number: its journal entry is the first one's
    wait_until(lambda: stack.view().counters().get("applied", 0) >= 200, 30, "counters")
    assert store.journal("demo", "invoice-17") == first
    assert store.read("counter:invoices").fields == {"number": 200}
