"""The identities page's examples (ops/docs/identities.md), run as written against real
receiver and worker processes: the two-door race (two workers on PostgreSQL, one on
SQLite), and README's two curl deliveries that make one record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from keylane.workers.merges import live_end
from tests.support.readme import (
    example_crm,
    install_page_app,
    page_block,
    readme_block_containing,
)
from tests.support.stack import Stack, settings_env, wait_until

pytestmark = pytest.mark.slow


def test_the_two_door_race_ends_as_fifty_records(stack: Stack, tmp_path: Path) -> None:
    # Given a receiver and two workers (one on SQLite)
    stack.receiver()
    workers = stack.writers(2)
    for _ in range(workers):
        stack.worker(lanes=16)
    stack.wait_all_owned(workers=workers)
    # When the page's script runs as written
    script = tmp_path / "two_doors.py"
    script.write_text(page_block("identities.md", "# two_doors.py"))
    env = {"RECEIVER_URL": stack.url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "250 accepted"
    # Then each person is one record, with every field of both senders, in order
    store = stack.open_store()

    def one(n: int) -> bool:
        by_email = live_end(store, f"person:p{n}@example.com")
        return by_email.key == live_end(store, f"person:+1555010{n:04d}").key

    wait_until(lambda: all(one(n) for n in range(50)), 120, "50 records", on_timeout=stack.logs)
    wait_until(lambda: store.journal_size() >= 350, 120, "every event and merge step")
    for n in range(50):
        record = live_end(store, f"person:p{n}@example.com")
        assert record.fields == {
            "name": f"Person {n}",
            "email": f"p{n}@example.com",
            "phone": f"+1555010{n:04d}",
            "company": f"Co {n % 7}",
            "form_seq": [2],
            "crm_seq": [2, 3],
        }
    live = [r for r in store.scan_records("person:", limit=1000) if r.merged_into is None]
    assert len(live) == 50
    demo = [e for e in store.journal_entries() if e.source == "demo"]
    assert len(demo) == 250
    assert {e.outcome for e in demo} == {"applied"}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_readme_two_names_of_one_person_make_one_record(stack: Stack) -> None:
    # Given a receiver and a worker on the port README's curl uses
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    block = readme_block_containing('"also"').replace("localhost:8000", stack.url)
    # When README's lines run as written
    done = subprocess.run(
        ["bash", "-c", block.split("\nkeylane records get")[0]],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Then the phone's record is merged into the email's, with both records' fields
    store = stack.open_store()
    wait_until(
        lambda: store.read("person:+15550100200").merged_into == "person:ann@example.com",
        60,
        "the merge",
        on_timeout=stack.logs,
    )
    wait_until(lambda: "company" in store.read("person:ann@example.com").fields, 60, "absorb")
    assert store.read("person:ann@example.com").fields == {"name": "Ann", "company": "Acme"}
    shown = stack.keylane("records", "get", "person:+15550100200")
    assert "merged into person:ann@example.com" in shown.stdout


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_tasks_two_contacts_of_ann_are_merged_in_the_example_crm(
    stack: Stack, tmp_path: Path
) -> None:
    page = "identities.md"
    # Given the example CRM, started by the page's command line (on a port of the test's)
    block = page_block(page, "python -m keylane.ops.examples.crm")
    with example_crm(block.splitlines()[0], tmp_path / "crm.log") as crm:
        # And the page's task and sources as written
        install_page_app(stack, tmp_path, page, "myapp.people", "[sources.signup]", CRM_URL=crm)
        stack.worker(lanes=4)
        stack.receiver()
        stack.wait_all_owned()
        # When the page's deliveries are sent as written
        deliveries = [line for line in block.splitlines() if "/webhooks/" in line]
        assert len(deliveries) == 3
        for line in deliveries:
            done = subprocess.run(
                ["bash", "-c", line.replace("localhost:8000", stack.url.removeprefix("http://"))],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done
            assert '"accepted"' in done.stdout, done

        # Then the CRM holds one contact of Ann, with what both senders said
        def ann() -> list[dict[str, Any]]:
            found = httpx.post(f"{crm}/contacts/search", json={"name": "Ann"}).json()
            return [c for c in found["results"] if c.get("plan") == "pro"]

        wait_until(lambda: len(ann()) == 1, 60, "one contact of Ann", on_timeout=stack.logs)
        store = stack.open_store()
        signup, billing = "person:Ann@Example.com", "person:+1 555 0100 200"
        wait_until(lambda: live_end(store, signup).key == live_end(store, billing).key, 60,
                   "one lane", on_timeout=stack.logs)  # fmt: skip
        (contact,) = ann()
        assert contact["keylane_key"] == live_end(store, signup).key
        assert {contact["phone"], contact["email"].lower()} == {
            "+1 555 0100 200",
            "ann@example.com",
        }
        assert (
            len(httpx.post(f"{crm}/contacts/search", json={"name": "Ann"}).json()["results"]) == 1
        )
        absorbs = [e for e in store.journal_entries() if e.event_id.startswith("absorb-")]
        assert len(absorbs) == 1
