"""Refusals and results where they are decided: a task's ``keylane.Refuse`` and what it
returns, a forward's status, conditions mapped by a source and conditions on records that
live elsewhere (an ETag API, the user's PostgreSQL table), with real receiver and worker
processes; and a refusal's review row, written in the same transaction as the refusal."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keylane.routing.contract.errors import AlreadyApplied, VersionConflict
from keylane.workers.dead_letters import malformed, refuse_with_review
from keylane.workers.lane_store import event_write
from keylane.workers.results import ApplyResult
from keylane.workers.store import DeadLetterStore
from keylane.workers.store_rows import DeadLetterFilter
from keylane.workers.stores.sql import SqlStore
from tests.support.etag_server import EtagServer
from tests.support.lane_parts import lane_event
from tests.support.notion import HookServer
from tests.support.stack import Stack, event, send_all, wait_until

REFUSAL = {"reason": "condition_unmet", "why": "owner is present ('ada')", "revision": 1}


# -- the store: a refusal and its review row are one transaction -------------------------


def _refused(store: DeadLetterStore, event_id: str, revision: int) -> ApplyResult:
    """Journal the refusal of ``event_id`` on slot:1 at ``revision``, with its review row."""
    ev = lane_event(event_id, "slot:1")
    write = event_write(ev, None, revision, 1, "refused", REFUSAL, decided_on_read=True)
    told = ApplyResult(
        "refused", attempts=1, revision=revision, reason="condition_unmet", result=REFUSAL
    )
    return refuse_with_review(store, ev, write, None, told)


def _fail_review_rows(store_url: str) -> None:
    """Make every insert of a review row fail in the database itself: a crash between the
    refusal and its row, as the database sees one."""
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "CREATE TRIGGER no_rows BEFORE INSERT ON dead_letters "
                "BEGIN SELECT RAISE(ABORT, 'crash before the review row'); END"
            )
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION no_rows() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'crash before the review row'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER no_rows BEFORE INSERT ON dead_letters "
            "FOR EACH ROW EXECUTE FUNCTION no_rows()"
        )


def test_a_refusal_whose_review_row_fails_is_not_journaled_either(
    store: SqlStore, store_url: str
) -> None:
    # Given a record at revision 1, and a store that fails the review row's insert
    store.commit_event(event_write(lane_event("e0", "slot:1"), {"owner": "ada"}, 0, 1), None)
    _fail_review_rows(store_url)
    # When a refusal that wants a review row is journaled
    with pytest.raises(Exception, match="crash before the review row"):
        _refused(store, "e1", 1)
    # Then neither is there: no refusal without its row
    assert store.journal("crm", "e1") is None
    assert store.dead_letters(DeadLetterFilter()) == []


def test_a_refusal_and_its_review_row_are_written_together_or_not_at_all(store: SqlStore) -> None:
    # Given a record at revision 1
    store.commit_event(event_write(lane_event("e0", "slot:1"), {"owner": "ada"}, 0, 1), None)
    # When a refusal decided on revision 0 (the record moved since) is journaled
    with pytest.raises(VersionConflict):
        _refused(store, "e1", 0)
    # Then nothing is written: it is decided again
    assert store.journal("crm", "e1") is None
    assert store.dead_letters(DeadLetterFilter()) == []
    # And decided on revision 1, the refusal and its row are there, the row naming it
    told = _refused(store, "e1", 1)
    entry = store.journal("crm", "e1")
    assert entry is not None
    assert (entry.outcome, entry.revision, entry.result) == ("refused", 1, REFUSAL)
    (row,) = store.dead_letters(DeadLetterFilter())
    assert (row.id, row.event_id, row.reason, row.status) == (
        told.dead_letter_id,
        "e1",
        "condition_unmet",
        "open",
    )
    assert row.error == REFUSAL["why"]
    # And a second copy of the event is a duplicate: no second row
    with pytest.raises(AlreadyApplied):
        _refused(store, "e1", 1)
    assert len(store.dead_letters(DeadLetterFilter())) == 1


def test_malformed_bytes_close_their_digest_and_retention_keeps_it_while_the_row_is_open(
    store: SqlStore,
) -> None:
    # Given malformed bytes delivered twice
    first = malformed(store, 3, b"garbage", "not a message", None)
    assert malformed(store, 3, b"garbage", "not a message", None) == first
    # Then their digest is closed in the journal under source "", listed as a source
    assert "" in store.journal_sources()
    far = time.time() + 10 * 365 * 86400
    # And the prune does not take that journal row while its review row is open
    assert store.old_rows("journal", far, 100, "") == []
    # Once the row is resolved, it goes with the journal's old rows like any other
    assert store.set_dead_letter_status(first, "resolved", ("open",), "ana")
    assert [r["event_id"] for r in store.old_rows("journal", far, 100, "")] == [
        store.dead_letters(DeadLetterFilter())[0].event_id
    ]


# -- real processes ----------------------------------------------------------------------

APP = "tests.support.refusing_tasks"

TASK_SOURCES = """
[sources.booking]
task = "book_slot"
record_key = "slot:{{body:slot}}"

[sources.reviewed]
task = "book_slot"
record_key = "slot:{{body:slot}}"
on_refusal = "review"

[sources.docs]
task = "render_doc"
record_key = "doc:{{body:doc}}"

[sources.shop]
destination = "hook"
record_key = "order:{{body:order}}"

[destinations.hook]
kind = "http"
url = "{hook}/hook"

[sources.store]
format = "mapped"
record_key = "item:{{body:sku}}"
event_type = "body:type"
on_refusal = "review"

[sources.store.on."restocked"]
stock = {{ set = "body:qty" }}
status = {{ set = "active" }}

[sources.store.on."ordered"]
stock = {{ increment = -1 }}
last_order = {{ set = "body:id" }}

[sources.store.conditions."ordered"]
stock = {{ gte = "body:min" }}
status = {{ in = ["active", "back_in_stock"] }}
"""


def _told(stack: Stack, body: dict[str, Any], source: str, code: int) -> dict[str, Any]:
    """POST with ``Prefer: wait=10``; the told outcome, answered with ``code``."""
    answer = stack.post(body, source=source, prefer="wait=10")
    assert answer.status_code == code, (answer.status_code, answer.text, stack.logs())
    assert answer.headers["preference-applied"] == "wait=10"
    told: dict[str, Any] = answer.json()
    return told


@pytest.mark.slow
def test_a_task_refusal_its_result_a_forward_status_and_mapped_conditions_are_told(
    stack: Stack, tmp_path: Path
) -> None:
    hook = HookServer().start()
    try:
        # Given tasks that refuse and return, a forward, and a source that maps conditions
        runs = tmp_path / "runs.txt"
        runs.touch()
        sources = tmp_path / "sources.toml"
        sources.write_text(TASK_SOURCES.format(hook=hook.url))
        update = {"sources_file": sources, "app": APP, "result_max_bytes": 256}
        stack.settings = stack.settings.model_copy(update=update)
        stack.extra_env["TEST_RUNS_FILE"] = str(runs)
        stack.worker(lanes=4)
        stack.receiver()
        stack.wait_all_owned()

        # When a task returns JSON, Then the sender is told it as the result
        told = _told(stack, {"id": "b-1", "slot": 1, "who": "ada"}, "booking", 200)
        assert told["result"] == {"returned": {"booked": 1, "who": "ada"}}
        # When it raises keylane.Refuse, Then 409 with the reason and the details
        told = _told(stack, {"id": "b-2", "slot": 1, "taken": True}, "booking", 409)
        assert (told["status"], told["reason"], told["dead_letter_id"]) == (
            "refused",
            "slot taken",
            None,
        )
        assert told["result"]["details"] == {"slot": 1, "by": "someone else"}
        # And returned rather than raised, the same
        told = _told(stack, {"id": "b-3", "slot": 2, "politely": True}, "booking", 409)
        assert (told["reason"], told["result"]["why"]) == ("slot taken", "slot taken")
        # And a source that asks for review rows gets one with the refusal
        told = _told(stack, {"id": "r-1", "slot": 3, "taken": True}, "reviewed", 409)
        assert told["dead_letter_id"] is not None
        # When a task returns more than KEYLANE_RESULT_MAX_BYTES, or what is not JSON,
        # Then it is applied, and its result says why the value was dropped
        told = _told(stack, {"id": "d-1", "doc": 1, "kind": "big"}, "docs", 200)
        assert told["result"]["dropped"] == "result_too_large"
        assert told["result"]["max_bytes"] == 256
        assert told["result"]["bytes"] > 2000
        told = _told(stack, {"id": "d-2", "doc": 2, "kind": "set"}, "docs", 200)
        assert told["result"]["dropped"] == "not_json"
        # When a forward's destination answers 200, Then its result is that status
        told = _told(stack, {"id": "o-1", "order": 7}, "shop", 200)
        assert told["result"] == {"status": 200}

        # When a provider's payloads carry what the source maps to conditions
        restock = {"id": "s-0", "type": "restocked", "sku": "A", "qty": 1}
        restocked = _told(stack, restock, "store", 200)["result"]["fields"]
        assert restocked == {"stock": 1, "status": "active"}
        order = {"type": "ordered", "sku": "A", "min": 1}
        sold = _told(stack, {**order, "id": "s-1"}, "store", 200)
        late = _told(stack, {**order, "id": "s-2"}, "store", 409)
        # Then the first is sold, the second refused with the stock it saw (the bound
        # taken from its payload), with its review row
        assert sold["result"] == {"revision": 2, "fields": {"stock": 0, "last_order": "s-1"}}
        assert (late["result"]["field"], late["result"]["seen"]) == ("stock", 0)
        assert late["result"]["condition"] == {"stock": {"gte": 1}}
        assert late["dead_letter_id"] is not None
        # And a reference the payload lacks is a 400: a condition is never dropped
        lacking = {"id": "s-4", "type": "ordered", "sku": "A"}
        assert stack.post(lacking, source="store").status_code == 400

        # And the journal keeps each outcome, a refusal not retried and no dead letter
        store = stack.open_store()
        entry = store.journal("booking", "b-2")
        assert entry is not None
        assert (entry.outcome, entry.attempts) == ("refused", 1)
        assert entry.result is not None
        assert entry.result["why"] == "slot taken"
        assert store.read("item:A").fields == {"stock": 0, "status": "active", "last_order": "s-1"}
        time.sleep(0.5)  # a retry, if there were one, would run meanwhile
        assert Counter(runs.read_text().split())["b-2"] == 1
        assert Counter(runs.read_text().split())["r-1"] == 1
        rows = {r.event_id: r for r in store.dead_letters(DeadLetterFilter())}
        assert sorted(rows) == ["r-1", "s-2"]
        assert (rows["r-1"].reason, rows["r-1"].error, rows["r-1"].status) == (
            "slot taken",
            "slot taken",
            "open",
        )
        assert rows["s-2"].reason == "condition_unmet"
        assert rows["s-2"].id == late["dead_letter_id"]
        # And the refusals are counted
        counters = stack.view().counters()
        assert counters.get("refused") == 4, counters
    finally:
        hook.stop()


ELSEWHERE_SOURCES = """
[sources.crm]
owns = ["owner"]
records_in = "slots"

[destinations.slots]
kind = "etag"
url = "{url}/records/{{key}}"
fields_at = "fields"

[sources.wh]
owns = ["owner"]
records_in = "warehouse"
on_refusal = "review"

[destinations.warehouse]
kind = "pg_table"
url_env = "WAREHOUSE_URL"
table = "{schema}.slots"
key = "{{key.1}}"
version_column = "revision"
version_kind = "integer"
columns = {{ owner = "owner" }}
"""


@pytest.fixture
def warehouse(pg_url: str) -> Iterator[tuple[str, str]]:
    """(database URL, schema) of the user's own table of slots, dropped afterwards."""
    schema = f"kltest_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f"CREATE TABLE {schema}.slots (id text PRIMARY KEY, owner text, "
            "revision bigint NOT NULL)"
        )
    try:
        yield pg_url, schema
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _writes(server: EtagServer, key: str) -> list[Any]:
    """keylane's writes to ``key`` (after the test's own first one, which made it)."""
    return [op for op in server.ops_of(key) if op.kind in ("put", "patch", "create")][1:]


def _book(event_id: str, slot: str, who: str, **extra: Any) -> dict[str, Any]:
    body = event(event_id, slot, owner={"set": who})
    return {**body, "conditions": {"owner": {"absent": True}}, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_conditions_on_records_elsewhere_write_at_the_version_read_and_refuse_once(
    stack: Stack, tmp_path: Path, warehouse: tuple[str, str]
) -> None:
    pg, schema = warehouse
    with EtagServer() as server:
        # Given slots in an ETag API and in the user's PostgreSQL table
        keys = [f"slot:{n}" for n in range(20)]
        for key in keys:
            server.handle("PUT", key, {}, {"fields": {"room": "A"}})
        sources = tmp_path / "sources.toml"
        sources.write_text(ELSEWHERE_SOURCES.format(url=server.url, schema=schema))
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        stack.extra_env["WAREHOUSE_URL"] = pg
        stack.worker(lanes=8)
        stack.receiver()
        stack.wait_all_owned()

        # When a booking's condition holds where the record lives
        applied = stack.post(_book("m-1", "slot:100", "ada"), source="crm")
        assert applied.status_code == 202
        server.handle("PUT", "slot:101", {}, {"fields": {"room": "B"}})
        told = _told(stack, _book("m-2", "slot:101", "ada"), "crm", 200)
        # Then it is written once (If-Match the version it read: the server refuses any
        # other), and told the version it wrote
        (put,) = _writes(server, "slot:101")
        assert put.changed == {"owner": "ada"}
        assert told["result"] == {"version": f'"v{put.version}"', "fields": {"owner": "ada"}}
        # When another client books it, Then it is refused with the value it saw there
        told = _told(stack, _book("m-3", "slot:101", "bob"), "crm", 409)
        assert (told["result"]["field"], told["result"]["seen"]) == ("owner", "ada")
        assert told["result"]["version"] == f'"v{put.version}"'
        assert server.fields("slot:101") == {"room": "B", "owner": "ada"}
        # And in the PostgreSQL table: written at the version read, then refused (the
        # source asks for review rows: one with the refusal)
        told = _told(stack, _book("w-1", "slot:107", "ada", if_revision=0), "wh", 200)
        assert told["result"] == {"version": 1, "fields": {"owner": "ada"}}
        told = _told(stack, _book("w-2", "slot:107", "bob"), "wh", 409)
        assert (told["result"]["seen"], told["result"]["version"]) == ("ada", 1)
        assert told["dead_letter_id"] is not None

        # When two clients race for each of 20 slots in each place (the booking form)
        bodies = [
            (_book(f"r-{place}-{key}-{who}", key, who), place)
            for key in keys
            for who in ("ada", "bob")
            for place in ("crm", "wh")
        ]
        for place in ("crm", "wh"):
            answers = send_all(stack, [b for b, p in bodies if p == place], 8, source=place)
            assert {a.status_code for a in answers} == {202}
        stack.wait_journal(5 + len(bodies))
        # Then each slot was written exactly once in each place, to the client told so
        store = stack.open_store()
        outcomes = {e.event_id: e.outcome for e in store.journal_entries()}
        with psycopg.connect(pg) as conn:
            table = dict(conn.execute(f"SELECT id, owner FROM {schema}.slots").fetchall())
            revisions = dict(conn.execute(f"SELECT id, revision FROM {schema}.slots").fetchall())
        for key in keys:
            writes = _writes(server, key)
            crm_owner = server.fields(key)["owner"]
            assert [op.changed for op in writes] == [{"owner": crm_owner}]
            wh_owner = table[key.split(":")[1]]
            assert revisions[key.split(":")[1]] == 1
            for place, owner in (("crm", crm_owner), ("wh", wh_owner)):
                other = "bob" if owner == "ada" else "ada"
                assert outcomes[f"r-{place}-{key}-{owner}"] == "applied"
                assert outcomes[f"r-{place}-{key}-{other}"] == "refused"
        # And each refusal in the table's source has its review row, none of the other's
        rows = store.dead_letters(DeadLetterFilter())
        assert sorted(r.source for r in rows) == ["wh"] * 21
        assert {r.reason for r in rows} == {"condition_unmet"}


@pytest.mark.slow
def test_a_worker_killed_after_a_reviewed_refusal_leaves_it_with_exactly_one_row(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source that wants a review row of each refusal, and a slot booked by ada
    sources = tmp_path / "sources.toml"
    sources.write_text('[sources.demo]\non_refusal = "review"\n')
    stack.settings = stack.settings.model_copy(update={"sources_file": sources})
    first = stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    assert _told(stack, _book("c-1", "crash:1", "ada"), "demo", 200)["status"] == "applied"
    first.stop()
    kill = [{"point": "worker.before_ack", "action": "kill", "match": "crash:"}]
    doomed = stack.worker(lanes=2, faults=kill)
    stack.wait_all_owned()
    # When the other client's booking is refused, and its worker dies right after the
    # store committed the refusal (and its row), before the acknowledgement
    assert stack.post(_book("c-2", "crash:1", "bob")).status_code == 202
    wait_until(lambda: not doomed.alive(), 30, "the worker to die after the refusal")
    # And another worker redelivers it
    stack.worker(lanes=2)
    retry = stack.post(_book("c-2", "crash:1", "bob"), prefer="wait=30")
    # Then the retry is told the refusal, with the one review row made with it
    assert retry.status_code == 409, retry.text
    store = stack.open_store()
    (row,) = store.dead_letters(DeadLetterFilter())
    assert (row.event_id, row.reason) == ("c-2", "condition_unmet")
    assert retry.json()["result"]["seen"] == "ada"
    assert (retry.json()["dead_letter_id"], retry.json()["reason"]) == (row.id, "condition_unmet")
    entry = store.journal("demo", "c-2")
    assert entry is not None
    assert entry.outcome == "refused"
    assert store.read("crash:1").fields == {"owner": "ada"}
