"""Records that live elsewhere, end to end: a source's ``records_in`` names a version-checked
destination, and real receiver and worker processes write to a real HTTP server with ETags
while a person edits the same records there."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from keylane.workers.store_rows import DeadLetterFilter
from tests.support.etag_server import EtagServer
from tests.support.stack import REPO, Stack, event, settings_env, wait_until
from tests.test_dead_letters import keylane

# keylane's store only keeps the journal and review rows here; both kinds of store are
# covered by the store suite and the lane tests.
pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

SOURCES = """
[sources.crm]
owns = ["visits", "tags"]
records_in = "contacts"

[destinations.contacts]
kind = "etag"
url = "{url}/records/{{key}}"
fields_at = "fields"
"""


class Person(threading.Thread):
    """Someone editing the CRM the whole time: a note and a count of their own edits."""

    def __init__(self, server: EtagServer, keys: list[str]) -> None:
        super().__init__(daemon=True)
        self.server, self.keys = server, keys
        self.edits: Counter[str] = Counter()
        self.notes: dict[str, str] = {}
        self.done = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        n = 0
        while not self.done.wait(0.003):
            key = rng.choice(self.keys)
            n += 1
            change = {"notes": f"note {n}", "person_edits": self.edits[key] + 1}
            if self.server.edit(key, lambda _, change=change: change):
                self.edits[key], self.notes[key] = change["person_edits"], change["notes"]


def test_a_source_writes_where_its_records_live_and_loses_no_edit_of_a_person(
    stack: Stack, tmp_path: Path
) -> None:
    with EtagServer(delay_s=0.002) as server:
        # Given four contacts that live in a CRM with ETags (a person made them there)
        keys = [f"contact:{n}" for n in range(4)]
        for key in keys:
            server.handle("PUT", key, {}, {"fields": {"visits": 0, "tags": []}})
        # And a source whose records live there, owning visits and tags
        sources = tmp_path / "sources.toml"
        sources.write_text(SOURCES.format(url=server.url))
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        stack.worker(lanes=4)
        stack.receiver()
        stack.wait_all_owned()
        # When the person keeps editing those records while 30 events per contact arrive
        person = Person(server, keys)
        person.start()
        sent = _send_in_order(stack, keys, per_key=30)
        stack.wait_journal(len(sent))
        person.done.set()
        person.join()
        # Then every event has one outcome, and the dead-lettered ones are reviews of a race
        store = stack.open_store()
        rows = store.dead_letters(DeadLetterFilter())
        assert {row.reason for row in rows} <= {"conflict"}, [r.error for r in rows]
        lost = Counter(row.record_key for row in rows)
        for key in keys:
            fields = server.fields(key)
            applied = [e for e in sent if e[0] == key and not _dead(rows, e[1])]
            # each applied event counted exactly once, in send order
            assert fields["visits"] == len(applied), (key, fields)
            assert fields["tags"] == [tag for _, _, tag in applied]
            assert len(applied) == 30 - lost[key]
            # and no edit of the person was overwritten
            assert fields.get("person_edits", 0) == person.edits[key]
            assert fields.get("notes") == person.notes.get(key)
        refused = sum(op.kind == "refused" for op in server.ops)
        assert refused > 0, "the person never raced the lane: nothing was shown"


def test_a_change_that_cannot_apply_is_reviewed_against_the_record_where_it_lives(
    stack: Stack, tmp_path: Path
) -> None:
    with EtagServer() as server:
        # Given a contact in the CRM whose visits a person made text
        server.handle("PUT", "contact:9", {}, {"fields": {"visits": "many", "tags": []}})
        sources = tmp_path / "sources.toml"
        sources.write_text(SOURCES.format(url=server.url))
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned()
        # When an event increments visits, and another one changes a field the source
        # does not own
        changes = {"visits": {"increment": 1}, "tags": {"add": "vip"}}
        assert stack.post(event("t-1", "contact:9", **changes), source="crm").status_code == 202
        notes = {"notes": {"set": "mine"}}
        assert stack.post(event("t-2", "contact:9", **notes), source="crm").status_code == 202
        stack.wait_journal(2)
        # Then both are review rows, and nothing was written to the CRM
        store = stack.open_store()
        rows = {row.event_id: row for row in store.dead_letters(DeadLetterFilter())}
        assert (rows["t-1"].reason, rows["t-2"].reason) == ("type", "not_owned")
        assert server.fields("contact:9") == {"visits": "many", "tags": []}
        # And `dlq show` puts the change beside the record as it is now, in the CRM
        server.edit("contact:9", lambda _: {"visits": 41})
        shown = json.loads(keylane(stack, "dlq", "show", str(rows["t-1"].id), "--json").stdout)
        assert shown["record_now"]["where"] == "contacts"
        assert shown["record_now"]["fields"] == {"visits": 41, "tags": []}
        by_field = {d["field"]: d for d in shown["fields"]}
        assert (by_field["visits"]["now"], by_field["visits"]["would_be"]) == (41, 42)
        # And as text: the versions where it lives, the error without its JSON trailer
        text = keylane(stack, "dlq", "show", str(rows["t-1"].id)).stdout
        assert "(in contacts)" in text, text
        assert "fields_found" not in text
        # And a change refused before anything was sent does not claim a call was made
        refused = keylane(stack, "dlq", "show", str(rows["t-2"].id)).stdout
        assert "call(s)" not in refused, refused
        assert "notes" in refused
        # And where the sources file is not in the command's environment, it says it
        # cannot read the record there, rather than showing keylane's empty record
        env = settings_env(stack.settings)
        del env["KEYLANE_SOURCES_FILE"]
        blind = subprocess.run(
            [sys.executable, "-m", "keylane.ops.cli", "dlq", "show", str(rows["t-1"].id)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert blind.returncode == 0, blind.stderr
        assert "cannot read the record in contacts" in blind.stdout, blind.stdout
        assert "KEYLANE_SOURCES_FILE" in blind.stdout
        assert "(in keylane)" not in blind.stdout
        assert "now 0" not in blind.stdout
        # And `dlq retry` runs it again through the lane, from a fresh read
        retried = keylane(stack, "dlq", "retry", str(rows["t-1"].id), "--yes")
        assert retried.returncode == 0, retried.stderr
        wait_until(
            lambda: server.fields("contact:9") == {"visits": 42, "tags": ["vip"]},
            30,
            "the retried event to be written to the CRM",
            on_timeout=stack.logs,
        )


def _send_in_order(stack: Stack, keys: list[str], per_key: int) -> list[tuple[str, str, str]]:
    """Send ``per_key`` events to each key, each key's in order (one thread per key);
    returns (key, event id, tag) in send order per key."""
    sent: dict[str, list[tuple[str, str, str]]] = {key: [] for key in keys}

    def send(key: str) -> None:
        for n in range(per_key):
            event_id, tag = f"{key}/{n}", f"e{n}"
            changes: dict[str, Any] = {"visits": {"increment": 1}, "tags": {"append": tag}}
            answer = stack.post(event(event_id, key, **changes), source="crm", retries=5)
            assert answer.status_code == 202, answer.text
            sent[key].append((key, event_id, tag))

    threads = [threading.Thread(target=send, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [item for key in keys for item in sent[key]]


def _dead(rows: list[Any], event_id: str) -> bool:
    return any(row.event_id == event_id for row in rows)


def test_a_worker_killed_between_the_write_and_the_journal_never_writes_twice(
    stack: Stack, tmp_path: Path
) -> None:
    with EtagServer() as server:
        # Given a contact in the CRM, and a worker that dies right after its write to the
        # CRM was answered, before keylane's journal knows of it
        server.handle("PUT", "contact:7", {}, {"fields": {"visits": 0, "tags": []}})
        sources = tmp_path / "sources.toml"
        sources.write_text(SOURCES.format(url=server.url))
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        kill = [{"point": "destination.after_call", "action": "kill", "match": "contact:7"}]
        victim = stack.worker(lanes=2, faults=kill)
        stack.receiver()
        stack.wait_all_owned()
        changes = {"visits": {"increment": 1}, "tags": {"append": "e1"}}
        assert stack.post(event("k-1", "contact:7", **changes), source="crm").status_code == 202
        wait_until(lambda: not victim.alive(), 30, "the worker to die after its write")
        # When another worker takes its shards over and runs the event again
        stack.worker(lanes=2)
        stack.wait_journal(1)
        # Then the CRM holds the event's effect once, and the event is up for review: keylane
        # cannot tell its own unanswered write from someone else's
        assert server.fields("contact:7") == {"visits": 1, "tags": ["e1"]}
        (row,) = stack.open_store().dead_letters(DeadLetterFilter())
        assert (row.event_id, row.reason) == ("k-1", "outcome_unknown")
        # And the record's later events apply as usual
        more = {"visits": {"increment": 1}, "tags": {"append": "e2"}}
        assert stack.post(event("k-2", "contact:7", **more), source="crm").status_code == 202
        wait_until(
            lambda: server.fields("contact:7") == {"visits": 2, "tags": ["e1", "e2"]},
            30,
            "the next event",
            on_timeout=stack.logs,
        )
