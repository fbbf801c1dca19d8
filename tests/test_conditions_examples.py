"""The three examples of ops/docs/conditions.md, run as written (read from the page) against
a real receiver and real workers, on both stores: the booking form, the last item in
stock, invoice numbers. The outcomes are read back from the store's journal."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import httpx
import pytest

from tests.support.page_scripts import book_50_slots_twice, outcomes_of, run_page_script
from tests.support.readme import page_block_containing
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow
PAGE = "conditions.md"


def _start(stack: Stack, workers: int) -> None:
    """A receiver and ``workers`` worker processes, every shard owned."""
    stack.receiver()
    for _ in range(workers):
        stack.worker(lanes=16)
    stack.wait_all_owned(workers=workers)


def test_the_booking_form_books_each_slot_once_and_refuses_the_other_client(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver and a worker
    _start(stack, workers=1)
    book_50_slots_twice(stack, tmp_path)
    # And the page's `journal find` of slot 7's loser prints its refusal as shown (the
    # loser of the race named in the command: the page's is bob, this run's may be ada)
    block = page_block_containing(PAGE, "keylane journal find book-7-bob --json")
    command, *shown = block.splitlines()
    store = stack.open_store()
    winner = store.read("slot:7").fields["owner"]
    loser = "bob" if winner == "ada" else "ada"
    args = shlex.split(command.replace("book-7-bob", f"book-7-{loser}"))
    assert args[0] == "keylane"
    found = stack.keylane(*args[1:])
    assert found.returncode == 0, found.stdout + found.stderr
    (entry,) = json.loads(found.stdout)
    shown_text = " ".join(line.removeprefix("# ") for line in shown)
    for key in ("where", "source", "outcome", "revision"):
        assert f'"{key}": {json.dumps(entry[key])}' in shown_text, (key, entry)
    assert entry["event_id"] == f"book-7-{loser}"
    result = entry["result"]
    assert (result["field"], result["seen"]) == ("owner", winner)
    assert result["why"] == f"owner is present ('{winner}')"
    assert '"why": "owner is present (\'ada\')"' in shown_text


def test_the_last_item_is_sold_once_and_stock_never_goes_below_zero(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver and a worker
    _start(stack, workers=1)
    # When a web and a marketplace order arrive at once for each of 100 items in stock 1
    assert run_page_script(stack, tmp_path, PAGE, "# last_item.py").strip() == "200 orders accepted"
    stack.wait_journal(300)
    # Then each item is at 0, and exactly one of its orders applied, the other refused
    store = stack.open_store()
    outcomes = outcomes_of(store, "order-")
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
    assert run_page_script(stack, tmp_path, PAGE, "# invoices.py").strip() == "200 accepted"
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
