"""The dead-letter review queue: every reason from a real scenario, bulk retry under load,
the hold policy, and a failing handler that does not stop its shard."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from keylane.ops.outside_edit import edit_record
from keylane.ops.triage import Triage
from keylane.routing.contract.settings import FaultSpec
from keylane.workers.store_rows import DeadLetter, DeadLetterFilter
from tests.support.stack import REPO, Stack, event, settings_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)]

SOURCES = """
[sources.demo]

[sources.narrow]
owns = ["a"]

[sources.careful]
on_dead_letter = "hold"

[sources.handled]
handler = "tests.support.handlers:fail_on_bad"

[sources.legacy]
"""


def _start(stack: Stack, tmp_path: Path, **settings: Any) -> Path:
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    stack.settings = stack.settings.model_copy(
        update={"sources_file": sources, "max_deliveries": 3, **settings}
    )
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    return sources


def keylane(
    stack: Stack, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the ``keylane`` CLI against the test deployment."""
    return subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *args],
        env=settings_env(stack.settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        input=input_text,
        timeout=120,
    )


def _rows(stack: Stack, **flt: Any) -> list[DeadLetter]:
    return stack.open_store().dead_letters(DeadLetterFilter(**flt))


def _one_row(stack: Stack, reason: str) -> DeadLetter:
    wait_until(
        lambda: len(_rows(stack, reasons=(reason,))) == 1,
        60,
        f"a {reason} row",
        on_timeout=stack.logs,
    )
    return _rows(stack, reasons=(reason,))[0]


def test_each_reason_comes_from_a_real_scenario(stack: Stack, tmp_path: Path) -> None:
    sources = _start(stack, tmp_path)
    # type: an increment of a text field
    assert stack.post(event("t-1", "contact:1", name={"set": "Ada"})).status_code == 202
    assert stack.post(event("t-2", "contact:1", name={"increment": 1})).status_code == 202
    row = _one_row(stack, "type")
    assert (row.source, row.event_id, row.record_key, row.status) == (
        "demo",
        "t-2",
        "contact:1",
        "open",
    )
    assert row.attempted_change == {"name": {"increment": 1}}
    assert row.revision_read == row.revision_found == 1
    assert "not a number" in row.error
    # not_owned: a field the source does not own
    assert stack.post(event("o-1", "contact:2", b={"set": 1}), source="narrow").status_code == 202
    row = _one_row(stack, "not_owned")
    assert row.source == "narrow"
    assert "does not own field(s) b" in row.error
    # id_reused: the same id with another body
    assert stack.post(event("r-1", "contact:3", a={"set": 1})).status_code == 202
    assert stack.post(event("r-1", "contact:3", a={"set": 2})).status_code == 409
    row = _one_row(stack, "id_reused")
    assert row.attempted_change == {"a": {"set": 2}}
    # handler_error: a handler that fails the same way on every delivery
    assert stack.post(event("h-1", "bad:1", a={"set": 1}), source="handled").status_code == 202
    row = _one_row(stack, "handler_error")
    assert row.attempts == 3
    assert "cannot deal with bad:1" in row.error
    # malformed: bytes in a shard queue that are not a task message
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    client.lpush(stack.settings.keys.queue(stack.settings.shards.queue_name(5)), b"not a message")
    client.close()
    row = _one_row(stack, "malformed")
    assert row.shard == 5
    assert row.event == {"raw": "not a message"}
    # unknown_source: a worker that no longer knows the source the receiver accepted for
    narrower = tmp_path / "worker-sources.toml"
    narrower.write_text(SOURCES.replace("[sources.legacy]", ""))
    for proc in stack.procs:
        if proc.name.startswith("worker"):
            proc.stop()
    stack.worker(lanes=2, sources_file=str(narrower))
    stack.wait_all_owned()
    assert stack.post(event("l-1", "contact:4", a={"set": 1}), source="legacy").status_code == 202
    row = _one_row(stack, "unknown_source")
    assert "legacy" in row.error
    # And the CLI lists all of them, as a table and as JSON
    listed = keylane(stack, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {r["reason"] for r in json.loads(listed.stdout)} == {
        "type",
        "not_owned",
        "id_reused",
        "handler_error",
        "malformed",
        "unknown_source",
    }
    table = keylane(stack, "dlq", "list")
    assert table.stdout.splitlines()[0].split() == [
        "ID",
        "AGE",
        "STATUS",
        "REASON",
        "SOURCE",
        "EVENT",
        "RECORD",
        "READ",
        "FOUND",
        "TRIES",
    ]
    assert "6 row(s)" in table.stdout
    assert sources.exists()


def test_poison_message_that_kills_its_worker_is_dead_lettered(
    stack: Stack, tmp_path: Path
) -> None:
    # Given workers that die (SIGKILL) whenever they write to poison:1
    stack.settings.faults.append(
        FaultSpec(point="worker.before_write", action="kill", match="poison:")
    )
    _start(stack, tmp_path, max_deliveries=2)
    assert stack.post(event("p-1", "poison:1", a={"set": 1})).status_code == 202
    assert stack.post(event("p-2", "poison:1", a={"set": 2})).status_code == 202
    # When each death is followed by a restart (what keylane up does: one worker, SQLite)
    for _ in range(3):
        wait_until(
            lambda: not any(p.alive() for p in stack.procs if p.name.startswith("worker")),
            30,
            "the worker to die on the poison event",
        )
        if _rows(stack, reasons=("poison",)):
            break
        stack.worker(lanes=2)
        if len(_rows(stack, reasons=("poison",))) == 1:
            break
    # Then after two deaths the event is a poison dead letter and the shard moves on
    row = _one_row(stack, "poison")
    assert row.event_id == "p-1"
    assert "worker died" in row.error
    assert row.attempts == 2


def test_a_failing_handler_does_not_stop_its_shard(stack: Stack, tmp_path: Path) -> None:
    _start(stack, tmp_path)
    shards = stack.settings.shards
    shard = shards.shard_for_key("bad:1")
    neighbours = [
        k for k in (f"good:{n}" for n in range(2000)) if shards.shard_for_key(k) == shard
    ][:5]
    assert len(neighbours) == 5
    # Given an event whose handler raises, followed by events for other records on its shard
    assert stack.post(event("x-0", "bad:1", a={"set": 1}), source="handled").status_code == 202
    for n, key in enumerate(neighbours):
        assert (
            stack.post(event(f"x-{n + 1}", key, a={"set": n}), source="handled").status_code == 202
        )
    # Then those records are applied, and the failing one becomes a dead letter
    stack.wait_journal(6)
    store = stack.open_store()
    for n, key in enumerate(neighbours):
        assert store.read(key).fields == {"a": n}
    assert _one_row(stack, "handler_error").record_key == "bad:1"


def test_hold_policy_parks_later_events_until_the_row_is_resolved(
    stack: Stack, tmp_path: Path
) -> None:
    _start(stack, tmp_path)
    # Given a source whose dead letters hold their key, and one that fails
    post = lambda eid, **ch: stack.post(event(eid, "lead:1", **ch), source="careful")  # noqa: E731
    assert post("c-0", name={"set": "Ada"}).status_code == 202
    assert post("c-1", name={"increment": 1}).status_code == 202  # type error: held
    row = _one_row(stack, "type")
    # When later events for the key arrive, they wait, in order
    for n in range(2, 6):
        assert post(f"c-{n}", seq={"append": n}).status_code == 202
    broker = stack.broker()
    wait_until(lambda: broker.queued("lead:1") == 4, 20, "four parked events")
    assert broker.held_by("lead:1") == row.id
    assert "seq" not in stack.open_store().read("lead:1").fields
    # And other keys go on
    assert stack.post(event("c-x", "lead:2", a={"set": 1}), source="careful").status_code == 202
    wait_until(lambda: stack.open_store().read("lead:2").exists, 20, "lead:2 applied")
    # When the row is resolved with the CLI
    done = keylane(stack, "dlq", "resolve", str(row.id), "--note", "fixed in the CRM", "--yes")
    assert done.returncode == 0, done.stderr
    assert "released lead:1: 4 parked event(s) go next" in done.stdout
    # Then the parked events apply, in order, and the key is free again
    wait_until(
        lambda: stack.open_store().read("lead:1").fields.get("seq") == [2, 3, 4, 5],
        30,
        "the parked events to apply in order",
    )
    assert broker.held_by("lead:1") is None
    resolved = stack.open_store().dead_letter(row.id)
    assert resolved is not None
    assert (resolved.status, resolved.note) == ("resolved", "fixed in the CRM")
    assert resolved.status_by


def test_a_row_closed_while_its_hold_is_being_written_still_releases_the_record(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source whose dead letters hold their key, and a worker that pauses after it
    # wrote race:1's dead letter, before it holds the record (a slow moment, made long)
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    stack.settings = stack.settings.model_copy(
        update={"sources_file": sources, "max_deliveries": 3}
    )
    pause = FaultSpec(
        point="worker.before_ack", action="sleep", sleep_ms=10_000, match="race:", times=1
    )
    worker = stack.worker(lanes=2, faults=[pause.model_dump()])
    stack.receiver()
    stack.wait_all_owned()
    store = stack.open_store()
    store.write_outside("race:1", {"name": "Ada"}, 0)
    # When its event fails (an increment of a text field), and an operator discards the
    # row in that moment: there is no hold yet, so triage has nothing to release
    post = lambda eid, **ch: stack.post(event(eid, "race:1", **ch), source="careful")  # noqa: E731
    assert post("r-1", name={"increment": 1}).status_code == 202
    row = _one_row(stack, "type")
    wait_until(lambda: "fault injected: sleep at worker.before_ack (race:1)" in worker.log(),
               60, "the worker paused before the hold", on_timeout=stack.logs)  # fmt: skip
    broker = stack.broker()
    closed = Triage(store, broker).close(row, "discarded", "ops", "not needed")
    assert (closed.outcome, closed.detail) == ("closed", "")
    # And a later event of the record comes
    assert post("r-2", name={"set": "Bob"}).status_code == 202
    # Then the worker, finding the row closed once it held the record, releases it, and
    # the later event applies
    wait_until(lambda: store.read("race:1").fields.get("name") == "Bob", 60,
               "the later event applied", on_timeout=stack.logs)  # fmt: skip
    assert broker.held_by("race:1") is None
    assert "closed while it held the record: released" in worker.log()


def test_a_row_retried_while_its_hold_is_being_written_runs_its_retry_first(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source whose dead letters hold their key, and a worker that pauses after it
    # wrote race:1's dead letter, before it holds the record
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    stack.settings = stack.settings.model_copy(
        update={"sources_file": sources, "max_deliveries": 3}
    )
    pause = FaultSpec(
        point="worker.before_ack", action="sleep", sleep_ms=10_000, match="race:", times=1
    )
    worker = stack.worker(lanes=2, faults=[pause.model_dump()])
    stack.receiver()
    stack.wait_all_owned()
    store = stack.open_store()
    store.write_outside("race:1", {"name": "Ada"}, 0)
    shards = stack.settings.shards
    mate = next(
        key
        for key in (f"mate:{n}" for n in range(10_000))
        if shards.shard_for_key(key) == shards.shard_for_key("race:1")
    )
    post = lambda eid, key="race:1", **ch: stack.post(event(eid, key, **ch), source="careful")  # noqa: E731
    assert post("r-1", name={"increment": 1}).status_code == 202
    row = _one_row(stack, "type")
    wait_until(lambda: "fault injected: sleep at worker.before_ack (race:1)" in worker.log(),
               60, "the worker paused before the hold", on_timeout=stack.logs)  # fmt: skip
    # When in that moment the record is fixed and the row retried (no hold yet: the retry
    # joins the record's messages like a new event), and a shard-mate's event makes the
    # other lane admit it behind the dead-lettered one
    broker = stack.broker()
    edit_record(store, "race:1", {"name": 5})
    retried = Triage(store, broker).retry(row, "ops")
    assert (retried.outcome, retried.detail) == ("queued", "")
    assert post("m-1", key=mate, x={"set": 1}).status_code == 202
    wait_until(lambda: store.read(mate).fields.get("x") == 1, 60, "the shard-mate applied",
               on_timeout=stack.logs)  # fmt: skip
    # And a later event of the record comes
    assert post("r-2", seq={"append": 2}).status_code == 202
    # Then the hold meets the retry in the record's messages: the retry runs first, then
    # the later event, and nothing is left held
    wait_until(lambda: store.read("race:1").fields.get("seq") == [2], 60,
               "the later event applied", on_timeout=stack.logs)  # fmt: skip
    assert store.read("race:1").fields.get("name") == 6
    assert broker.held_by("race:1") is None
    # (its message leaves the record's list once acknowledged, just after the write)
    wait_until(lambda: broker.queued("race:1") == 0, 60, "race:1's list emptied",
               on_timeout=stack.logs)  # fmt: skip


def test_retrying_the_holding_row_applies_it_first_then_the_parked_events(
    stack: Stack, tmp_path: Path
) -> None:
    _start(stack, tmp_path)
    post = lambda eid, **ch: stack.post(event(eid, "lead:9", **ch), source="careful")  # noqa: E731
    assert post("k-0", total={"set": "oops"}).status_code == 202
    assert post("k-1", total={"increment": 10}, seq={"append": 1}).status_code == 202
    row = _one_row(stack, "type")
    for n in range(2, 5):
        assert post(f"k-{n}", seq={"append": n}).status_code == 202
    wait_until(lambda: stack.broker().queued("lead:9") == 3, 20, "parked events")
    # When someone fixes the record and retries the row
    assert keylane(stack, "records", "set", "lead:9", "total=0").returncode == 0
    retried = keylane(stack, "dlq", "retry", str(row.id), "--yes")
    assert retried.returncode == 0, retried.stderr
    again = keylane(stack, "dlq", "retry", str(row.id), "--yes", "--status", "retried")
    assert "already queued" in again.stdout
    # Then the retried event applies first, the parked ones after it, each once
    wait_until(
        lambda: stack.open_store().read("lead:9").fields.get("seq") == [1, 2, 3, 4],
        30,
        "retry then parked events",
        on_timeout=stack.logs,
    )
    record = stack.open_store().read("lead:9")
    assert record.fields["total"] == 10
    entry = stack.open_store().journal("careful", "k-1")
    assert entry is not None
    assert entry.outcome == "applied"


def test_bulk_retry_of_200_rows_while_new_events_arrive(stack: Stack, tmp_path: Path) -> None:
    _start(stack, tmp_path)
    keys = [f"acct:{k}" for k in range(20)]
    # Given 200 dead letters: increments of a field that is text on 20 records
    for key in keys:
        assert stack.post(event(f"{key}-init", key, n={"set": "text"})).status_code == 202
    bodies = [
        event(f"{key}-inc-{i}", key, n={"increment": i + 1}) for key in keys for i in range(10)
    ]
    for body in bodies:
        assert stack.post(body).status_code == 202
    wait_until(lambda: len(_rows(stack, reasons=("type",))) == 200, 120, "200 dead letters")
    # And the records fixed by hand (the same revision-checked edit as `records set`)
    fixer = stack.open_store()
    for key in keys:
        edit_record(fixer, key, {"n": 0})
    # When the rows are retried in bulk while new ordered events keep arriving for the keys
    stop = threading.Event()
    sent: dict[str, int] = {}

    def sender(key: str) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while not stop.is_set() or n < 5:
                n += 1
                assert (
                    stack.post(
                        event(f"{key}-seq-{n}", key, seq={"append": n}), client=client
                    ).status_code
                    == 202
                )
            sent[key] = n

    threads = [threading.Thread(target=sender, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    refused = keylane(stack, "dlq", "retry", "--reason", "type", input_text="n\n")
    assert refused.returncode != 0
    assert "Retry 200 dead letter(s) (200 type)?" in refused.stderr
    retried = keylane(stack, "dlq", "retry", "--reason", "type", "--yes", "--json")
    stop.set()
    for t in threads:
        t.join()
    assert retried.returncode == 0, retried.stderr
    assert [r["outcome"] for r in json.loads(retried.stdout)] == ["queued"] * 200
    # Then each retried event applied exactly once, new events stayed in order,
    # and the rows are marked retried
    store = stack.open_store()

    def settled() -> bool:
        for key in keys:
            fields = store.read(key).fields
            if fields.get("n") != 55 or len(fields.get("seq", [])) != sent[key]:
                return False
        return True

    wait_until(settled, 120, "retries and new events to apply", on_timeout=stack.logs)
    for key in keys:
        fields = store.read(key).fields
        assert fields["n"] == sum(range(1, 11)), key
        assert fields["seq"] == list(range(1, sent[key] + 1)), key
    assert len(_rows(stack, statuses=("retried",))) == 200
    assert _rows(stack, statuses=("open",)) == []
    again = keylane(stack, "dlq", "retry", "--status", "retried", "--yes", "--json")
    assert {r["outcome"] for r in json.loads(again.stdout)} == {"already queued"}


def test_cli_output_as_shown_in_the_readme(stack: Stack, tmp_path: Path) -> None:
    _start(stack, tmp_path)
    # Given two dead letters: a type error and a field the source does not own
    assert stack.post(event("evt_7", "contact:42", visits={"set": "many"})).status_code == 202
    assert stack.post(event("evt_8", "contact:42", visits={"increment": 1})).status_code == 202
    narrow = stack.post(event("evt_9", "contact:43", b={"set": 1}), source="narrow")
    assert narrow.status_code == 202
    wait_until(lambda: len(_rows(stack)) == 2, 30, "two dead letters")
    type_row = _rows(stack, reasons=("type",))[0]
    # list: a table, then JSON with every field
    table = keylane(stack, "dlq", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "AGE", "STATUS", "REASON"]
    assert table[-1] == "2 row(s)"
    rows = json.loads(keylane(stack, "dlq", "list", "--json", "--reason", "type").stdout)
    assert [r["event_id"] for r in rows] == ["evt_8"]
    assert set(rows[0]) >= {
        "id",
        "status",
        "reason",
        "source",
        "event_id",
        "record_key",
        "shard",
        "attempts",
        "revision_read",
        "revision_found",
        "error",
        "attempted_change",
        "event",
        "status_by",
        "status_at",
        "note",
    }
    # show: the change beside the record now; a marked line where applying would change it
    shown = keylane(stack, "dlq", "show", str(type_row.id)).stdout
    assert f"dead letter {type_row.id}  [open]  reason: type" in shown
    assert "revisions   read 1, found 1, now 1" in shown
    field_line = next(line for line in shown.splitlines() if line.lstrip("* ").startswith("visits"))
    assert '{"increment": 1}' in field_line
    assert '"many"' in field_line
    assert "cannot apply" in field_line
    shown_json = json.loads(keylane(stack, "dlq", "show", str(type_row.id), "--json").stdout)
    assert shown_json["record_now"] == {
        "where": "keylane",
        "revision": 1,
        "fields": {"visits": "many"},
    }
    assert shown_json["fields"][0]["field"] == "visits"
    # stats
    stats = json.loads(keylane(stack, "dlq", "stats", "--json").stdout)
    assert stats["by_status"] == {"open": 2}
    assert stats["open_by_reason"] == {"type": 1, "not_owned": 1}
    assert stats["oldest_open_age_s"] >= 0
    assert "oldest open row:" in keylane(stack, "dlq", "stats").stdout
    # export: JSON lines
    export = keylane(stack, "dlq", "export")
    assert sorted(json.loads(line)["event_id"] for line in export.stdout.splitlines()) == [
        "evt_8",
        "evt_9",
    ]
    assert "exported 2 row(s)" in export.stderr
    # discard and resolve report what they did; a second discard is skipped
    discarded = keylane(stack, "dlq", "discard", str(type_row.id), "--yes", "--note", "dup")
    assert discarded.stdout.startswith("discard: 1 closed")
    again = keylane(stack, "dlq", "discard", str(type_row.id), "--yes", "--status", "discarded")
    assert "1 skipped" in again.stdout
    resolved = keylane(
        stack, "dlq", "resolve", "--reason", "not_owned", "--note", "by hand", "--yes"
    )
    assert resolved.stdout.startswith("resolve: 1 closed")
    assert keylane(stack, "dlq", "list").stdout.splitlines()[-1] == "0 row(s)"
    # and bulk operations refuse to act on nothing in particular
    bare = keylane(stack, "dlq", "retry")
    assert bare.returncode == 2
    assert "give row IDs, a filter" in bare.stderr
