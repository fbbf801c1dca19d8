"""The conditions page's scripts run as written against a deployment's receiver, and the
booking race's checks: shared by the Redis tests (``tests/test_conditions_examples.py``)
and the RabbitMQ ones (``tests/test_rabbitmq_broker.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from keylane.workers.store import JournalStore
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.readme import page_block
from tests.support.stack import Stack


def run_page_script(stack: Stack, tmp_path: Path, page: str, first_line: str) -> str:
    """Run ``page``'s script that starts with ``first_line`` against the stack's receiver."""
    script = tmp_path / "example.py"
    script.write_text(page_block(page, first_line))
    env = {"RECEIVER_URL": stack.url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def outcomes_of(store: JournalStore, prefix: str) -> dict[str, str]:
    """The journal's outcome of each event whose id starts with ``prefix``."""
    return {e.event_id: e.outcome for e in store.journal_entries() if e.event_id.startswith(prefix)}


def book_50_slots_twice(stack: Stack, tmp_path: Path) -> None:
    """The booking page's race as written: 50 slots, two clients each; then each slot
    booked once, the other client refused with the value it saw."""
    # When two clients race for each of 50 slots (the page's script, as written)
    assert (
        run_page_script(stack, tmp_path, "conditions.md", "# booking.py").strip() == "100 accepted"
    )
    stack.wait_journal(100)
    # Then 50 bookings applied and 50 refused: one per slot each
    store = stack.open_store()
    outcomes = outcomes_of(store, "book-")
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
    assert stack.settled_counters().get("refused") == 50
