"""Version-checked destinations against real servers: an HTTP API with ETags written here
(:mod:`tests.support.etag_server`), the same API without versions, and PostgreSQL tables
in a schema of each test's own.

keylane gives a record key one writer (its lane), so each key's events are applied in
order from one thread, while people and other systems edit the same records at once."""

from __future__ import annotations

import random
import re
import threading
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest

from keylane.routing.contract.destinations import DestinationConfig
from keylane.routing.contract.errors import ConfigError, WriteConflict
from keylane.routing.contract.events import Change, Event, parse_changes
from keylane.routing.contract.resources import parse_resource
from keylane.routing.contract.sources import FieldOwnership, parse_sources
from keylane.workers.resource import Review, VersionedResource, Written, apply_versioned
from keylane.workers.resources import open_resource
from keylane.workers.store_rows import DeadLetterDraft
from tests.support.etag_server import EtagServer
from tests.support.readme import page_block, page_block_containing, page_text

OWNS = FieldOwnership.of(["count", "tags", "status"])
Result = Written | Review


def changes(**ops: dict[str, Any]) -> dict[str, Change]:
    return parse_changes(ops)


def http_resource(server: EtagServer, kind: str = "etag", **extra: Any) -> VersionedResource:
    table = {"kind": kind, "url": server.url + "/records/{key}", "fields_at": "fields", **extra}
    return open_resource(parse_resource("crm", table), {}, compare=OWNS)


def version_number(version: Any) -> int:
    return int(str(version).strip('"v'))


def run_lanes(
    keys: list[str],
    events: Callable[[str], list[dict[str, Change]]],
    resource: Callable[[], VersionedResource],
    max_attempts: int = 3,
) -> dict[str, list[Result]]:
    """One lane per key: its events applied in order, from one thread, one resource each."""
    results: dict[str, list[Result]] = {key: [] for key in keys}

    def lane(key: str) -> None:
        writer = resource()
        for change in events(key):
            results[key].append(apply_versioned(writer, key, change, OWNS, "crm", max_attempts))
        writer.close()

    run_threads([threading.Thread(target=lane, args=(key,)) for key in keys])
    return results


def run_threads(threads: list[threading.Thread], timeout_s: float = 60) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)


class Person(threading.Thread):
    """Someone editing records in the CRM's own screens the whole time: mostly fields the
    source does not own (``notes``, ``person_edits``), sometimes owned ones (``count`` +
    1000, ``status``)."""

    def __init__(self, server: EtagServer, keys: list[str], pause_s: float = 0.0005) -> None:
        super().__init__(daemon=True)
        self.server, self.keys, self.pause_s = server, keys, pause_s
        self.stopping = threading.Event()
        self.edits: Counter[str] = Counter()
        self.bumps: Counter[str] = Counter()
        self.last_note: dict[str, str] = {}
        self.statuses: dict[str, list[tuple[int, str]]] = {key: [] for key in keys}

    def run(self) -> None:
        rng = random.Random(14)
        n = 0
        while not self.stopping.is_set():
            n += 1
            key, kind = rng.choice(self.keys), n % 4
            version = self.server.edit(key, lambda f, n=n, kind=kind: self.change(f, n, kind))
            if version is not None:
                self.edits[key] += 1
                self.last_note[key] = f"n{n}"
                self.bumps[key] += kind == 0
                if kind == 1:
                    self.statuses[key].append((version, f"p{n}"))
            time.sleep(self.pause_s)

    @staticmethod
    def change(fields: dict[str, Any], n: int, kind: int) -> dict[str, Any]:
        out: dict[str, Any] = {"notes": f"n{n}", "person_edits": fields.get("person_edits", 0) + 1}
        if kind == 0:
            out["count"] = fields.get("count", 0) + 1000
        elif kind == 1:
            out["status"] = f"p{n}"
        return out

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def lane_events(key: str, per_key: int = 40) -> list[dict[str, Change]]:
    out = []
    for i in range(per_key):
        ops: dict[str, Any] = {"count": {"increment": 1}, "tags": {"add": f"e{i}"}}
        if i % 5 == 0:
            ops["status"] = {"set": f"k{i}"}
        out.append(parse_changes(ops))
    return out


# -- HTTP with ETags -----------------------------------------------------------------------


@pytest.mark.parametrize("write", ["patch", "put"])
def test_a_person_editing_while_lanes_write_loses_no_edit(write: str) -> None:
    # Given a CRM with ETags, and a person editing its records the whole time
    keys = [f"contact:{n}" for n in range(6)]
    with EtagServer(delay_s=0.001) as server:
        person = Person(server, keys)
        person.start()
        # When one lane per key applies 40 events to it, in order
        results = run_lanes(keys, lane_events, lambda: http_resource(server, write=write))
        person.stop()
        logs = {key: server.ops_of(key) for key in keys}
        final = {key: server.fields(key) for key in keys}
    # Then every record equals a serial order of every write that was made
    conflicts = 0
    for key in keys:
        applied = [i for i, r in enumerate(results[key]) if isinstance(r, Written)]
        reviews = [r for r in results[key] if isinstance(r, Review)]
        fields = final[key]
        # no edit of the person is lost, owned or not, and each event counts once
        assert fields["person_edits"] == person.edits[key]
        assert fields["notes"] == person.last_note[key]
        assert fields["count"] == len(applied) + 1000 * person.bumps[key]
        assert fields["tags"] == [f"e{i}" for i in applied]
        # the last writer of status in the server's version order holds it
        status_writes = person.statuses[key] + [
            (version_number(results[key][i].version), f"k{i}")  # type: ignore[union-attr]
            for i in applied
            if i % 5 == 0
        ]
        assert fields["status"] == max(status_writes)[1]
        # and every refused write is a conflict that was re-applied or is up for review
        refused = sum(op.kind == "refused" for op in logs[key])
        assert refused == sum(r.conflicts for r in results[key])
        for review in reviews:
            assert review.reason == "conflict"
            assert review.version_read != review.version_found
            assert review.fields_read is not None
            assert review.fields_found is not None
        conflicts += refused
    assert conflicts > 0, "the person never raced the lanes: nothing was shown"


def test_creators_racing_on_one_absent_record_make_one_and_the_rest_update_it() -> None:
    # Given a record that does not exist, and 8 writers that want to create it at once
    with EtagServer(delay_s=0.005) as server:
        # When they all apply their event together
        results = race(lambda: http_resource(server), "contact:new", 8)
        creates = [op for op in server.ops_of("contact:new") if op.kind == "create"]
        fields = server.fields("contact:new")
    # Then one created it (If-None-Match: *) and the others re-read and updated it
    check_race(results, fields, 8)
    assert len(creates) == 1


def race(resource: Callable[[], VersionedResource], key: str, n: int) -> list[Result]:
    barrier = threading.Barrier(n)
    results: list[Result] = []

    def creator(t: int) -> None:
        writer = resource()
        barrier.wait()
        change = changes(count={"increment": 1}, tags={"add": f"c{t}"})
        results.append(apply_versioned(writer, key, change, OWNS, "crm", max_attempts=n))
        writer.close()

    run_threads([threading.Thread(target=creator, args=(t,)) for t in range(n)])
    return results


def check_race(results: list[Result], fields: dict[str, Any], n: int) -> None:
    assert all(isinstance(r, Written) for r in results), results
    assert sum(r.created for r in results if isinstance(r, Written)) == 1
    assert sum(r.conflicts > 0 for r in results if isinstance(r, Written)) >= 1
    assert fields["count"] == n
    assert sorted(fields["tags"]) == sorted(f"c{t}" for t in range(n))


def test_a_change_to_a_field_the_source_does_not_own_is_a_review_before_any_call() -> None:
    # Given a source that owns count, tags and status
    with EtagServer() as server:
        # When an event would change notes
        with closing(http_resource(server)) as resource:
            result = apply_versioned(
                resource, "contact:1", changes(notes={"set": "x"}), OWNS, "crm"
            )
        # Then it is up for review, and the CRM was not even asked
        assert server.ops == []
    assert isinstance(result, Review)
    assert result.reason == "not_owned"
    assert "notes" in result.error


def test_a_write_the_resource_rejects_for_good_is_a_rejected_review_not_a_refusal() -> None:
    # Given a CRM that answers 404 to a create at the URL the resource is given
    with EtagServer() as server:
        table = {"kind": "etag", "url": server.url + "/gone/{key}", "fields_at": "fields"}
        with closing(open_resource(parse_resource("crm", table), {}, compare=OWNS)) as resource:
            # When an event would create the record there
            result = apply_versioned(resource, "contact:1", changes(count={"set": 1}), OWNS)
    # Then it is up for review as `rejected`, as an HTTP forward's 4xx is ("refused" is
    # an event's outcome when its conditions do not hold, and nothing else)
    assert isinstance(result, Review)
    assert result.reason == "rejected"
    assert "404" in result.error


def test_a_change_that_does_not_fit_the_record_is_up_for_review_with_both_bodies() -> None:
    # Given a record whose status is text
    with EtagServer() as server, closing(http_resource(server)) as resource:
        apply_versioned(resource, "contact:1", changes(status={"set": "new"}), OWNS)
        # When an event increments it
        result = apply_versioned(resource, "contact:1", changes(status={"increment": 1}), OWNS)
    # Then it is a review carrying the change and the record as read
    assert isinstance(result, Review)
    assert result.reason == "type"
    assert result.attempted_change == {"status": {"increment": 1}}
    assert result.fields_read == {"status": "new"}
    assert result.version_read == '"v1"'


def test_a_write_whose_answer_is_lost_is_settled_by_a_fresh_read() -> None:
    with EtagServer() as server, closing(http_resource(server)) as resource:
        apply_versioned(resource, "contact:1", changes(count={"increment": 1}), OWNS)
        # Given a write that is lost before it reaches the records
        server.drop["contact:1"] = "before"
        lost_before = apply_versioned(resource, "contact:1", changes(count={"increment": 1}), OWNS)
        # Then the version has not moved: it is sent again and counts once
        assert isinstance(lost_before, Written)
        assert lost_before.attempts == 2
        assert server.fields("contact:1")["count"] == 2
        # Given a write applied but whose answer is lost
        server.drop["contact:1"] = "after"
        lost_after = apply_versioned(resource, "contact:1", changes(count={"increment": 1}), OWNS)
        # Then keylane cannot tell it from another's: a review, never a second effect
        assert server.fields("contact:1")["count"] == 3
    assert isinstance(lost_after, Review)
    assert lost_after.reason == "outcome_unknown"
    assert (lost_after.version_read, lost_after.version_found) == ('"v2"', '"v3"')


def test_a_handler_computes_its_change_from_each_fresh_read() -> None:
    # Given a handler that sets status from the count it reads
    def tier(read: Any) -> dict[str, Change]:
        total = read.fields.get("count", 0) + 1
        return changes(count={"set": total}, status={"set": "gold" if total > 2 else "basic"})

    with EtagServer() as server, closing(http_resource(server)) as crm:
        apply_versioned(crm, "contact:1", tier, OWNS)
        # When a person raises the count in between, Then the next event computes from it
        server.edit("contact:1", lambda f: {"count": 5})
        result = apply_versioned(crm, "contact:1", tier, OWNS)
        assert server.fields("contact:1") == {"count": 6, "status": "gold"}
    assert isinstance(result, Written)
    assert result.attempts == 1


def test_a_review_fills_a_dead_letter_row() -> None:
    # Given a review result and the event it is about
    review = Review("conflict", "moved", {"count": {"increment": 1}}, 3, 5, {}, {}, 3, 3)
    event = Event(
        source="crm",
        event_id="evt_1",
        event_type="t",
        record_key="contact:1",
        changes=changes(count={"increment": 1}),
        body_sha256="0" * 64,
        accepted_at=0.0,
        shard=1,
    )
    # When a dead-letter draft is made of it, Then it carries the revisions read and found
    draft = DeadLetterDraft(
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        shard=event.shard,
        event=event.model_dump(mode="json"),
        **review.dead_letter_fields(),
    )
    assert (draft.revision_read, draft.revision_found, draft.reason) == (3, 5, "conflict")


# -- the user's PostgreSQL table -----------------------------------------------------------


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[tuple[str, str]]:
    """(database URL, a schema of this test's own), dropped afterwards."""
    schema = f"kltest_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield pg_url, schema
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


VERSION_COLUMNS = {
    "integer": ("revision", "revision bigint NOT NULL", "revision + 1"),
    "timestamp": (
        "updated_at",
        "updated_at timestamptz NOT NULL",
        "GREATEST(clock_timestamp(), updated_at + interval '1 microsecond')",
    ),
}


def pg_table(url: str, schema: str, version_kind: str) -> Callable[[], VersionedResource]:
    """The user's table (made here as a user would), and how keylane opens it."""
    column, ddl, _ = VERSION_COLUMNS[version_kind]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.contacts "
            f"(id text PRIMARY KEY, count bigint, tags jsonb, status text, note text, {ddl})"
        )
    config = parse_resource(
        "warehouse",
        {
            "kind": "pg_table",
            "url_env": "WAREHOUSE_URL",
            "table": f"{schema}.contacts",
            "key": "{key.1}",
            "version_column": column,
            "version_kind": version_kind,
            "columns": {"count": "count", "tags": "tags", "status": "status"},
        },
    )
    return lambda: open_resource(config, {"WAREHOUSE_URL": url})


def columns_of(url: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT column_name, data_type, is_nullable, column_default FROM "
            "information_schema.columns WHERE table_schema = %s ORDER BY column_name",
            (schema,),
        ).fetchall()


@pytest.mark.parametrize("version_kind", ["integer", "timestamp"])
def test_two_deployments_and_an_outside_writer_on_one_table_lose_no_update(
    pg_schema: tuple[str, str], version_kind: str
) -> None:
    url, schema = pg_schema
    resource = pg_table(url, schema, version_kind)
    before = columns_of(url, schema)
    keys = [f"contact:{n}" for n in range(3)]
    outside: Counter[str] = Counter()
    last_note: dict[str, str] = {}
    stop = threading.Event()

    def outside_writer() -> None:
        # Given another system updating the same rows: count + 1000 and a note of its own
        _, _, next_version = VERSION_COLUMNS[version_kind]
        column = VERSION_COLUMNS[version_kind][0]
        with psycopg.connect(url, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                key = keys[n % len(keys)]
                done = conn.execute(
                    f"UPDATE {schema}.contacts SET count = coalesce(count, 0) + 1000, "
                    f"note = %s, {column} = {next_version} WHERE id = %s",
                    (f"o{n}", key.split(":")[1]),
                ).rowcount
                if done:
                    outside[key] += 1
                    last_note[key] = f"o{n}"
                time.sleep(0.0005)

    results: dict[str, list[tuple[str, Result]]] = {key: [] for key in keys}

    def deployment(d: int) -> None:
        # two deployments, each with its own connection, write the same records
        writer = resource()
        for i in range(60):
            key = keys[i % len(keys)]
            change = changes(count={"increment": 1}, tags={"add": f"d{d}-{i}"})
            results[key].append((f"d{d}-{i}", apply_versioned(writer, key, change, OWNS, "", 5)))
        writer.close()

    # When both deployments apply their events while the outside writer runs
    other = threading.Thread(target=outside_writer)
    other.start()
    run_threads([threading.Thread(target=deployment, args=(d,)) for d in (1, 2)])
    stop.set()
    other.join(10)
    # Then every row holds each applied increment once and every outside update
    with psycopg.connect(url) as conn:
        rows = {
            f"contact:{r[0]}": r[1:]
            for r in conn.execute(f"SELECT id, count, tags, note FROM {schema}.contacts")
        }
    conflicts = 0
    for key in keys:
        applied = [tag for tag, r in results[key] if isinstance(r, Written)]
        count, tags, note = rows[key]
        assert count == len(applied) + 1000 * outside[key]
        assert sorted(tags) == sorted(applied)
        assert note == last_note.get(key)
        assert all(r.reason == "conflict" for _, r in results[key] if isinstance(r, Review))
        conflicts += sum(r.conflicts for _, r in results[key])
    assert conflicts > 0, "the writers never raced: nothing was shown"
    # and keylane did not touch the table's definition
    assert columns_of(url, schema) == before


def test_creators_racing_on_one_absent_row_make_one_and_the_rest_update_it(
    pg_schema: tuple[str, str],
) -> None:
    url, schema = pg_schema
    resource = pg_table(url, schema, "integer")
    # When 8 writers create the same absent row at once
    results = race(resource, "contact:7", 8)
    # Then one inserted it (ON CONFLICT DO NOTHING) and the others re-read and updated it
    with closing(resource()) as reader:
        row = reader.read("contact:7")
    check_race(results, row.fields, 8)
    assert row.version == 8


@pytest.mark.parametrize(
    ("ddl", "problem"),
    [
        ("id text PRIMARY KEY, count bigint, revision bigint", "no column(s) tags, status"),
        ("id text, count bigint, tags jsonb, status text, revision bigint", "unique index"),
        ("id text PRIMARY KEY, count bigint, tags jsonb, status text, revision text", "one of"),
    ],
)
def test_a_table_that_cannot_work_stops_keylane_at_start_up(
    pg_schema: tuple[str, str], ddl: str, problem: str
) -> None:
    url, schema = pg_schema
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.contacts ({ddl})")
    config = parse_resource(
        "warehouse",
        {
            "kind": "pg_table",
            "url_env": "WAREHOUSE_URL",
            "table": f"{schema}.contacts",
            "version_column": "revision",
            "columns": {"count": "count", "tags": "tags", "status": "status"},
        },
    )
    # When keylane opens it, Then it refuses, saying what is missing, and changes nothing
    with pytest.raises(ConfigError, match=re.escape(problem)):
        open_resource(config, {"WAREHOUSE_URL": url})
    with pytest.raises(ConfigError, match="WAREHOUSE_URL"):
        open_resource(config, {})


# -- configuration --------------------------------------------------------------------------


def test_a_destination_table_is_read_strictly() -> None:
    # Given tables with one mistake each, Then each is refused, naming the mistake
    mistakes = {
        "unknown placeholder {id}": {"kind": "etag", "url": "https://x/{id}"},
        "must name the record": {"kind": "etag", "url": "https://x/contacts"},
        "Extra inputs": {"kind": "stamped", "url": "https://x/{key}", "stamp": "t"},
        "kind must be one of": {"kind": "soap", "url": "https://x/{key}"},
        "schema.name": {
            "kind": "pg_table",
            "url_env": "U",
            "table": "a;drop",
            "version_column": "v",
            "columns": {"a": "a"},
        },
        "is set by keylane": {
            "kind": "etag",
            "url": "https://x/{key}",
            "headers": {"If-Match": "*"},
        },
    }
    for message, table in mistakes.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_resource("crm", table)


def test_headers_are_read_from_the_environment_at_start_up() -> None:
    config = parse_resource(
        "crm",
        {"kind": "etag", "url": "https://x/c/{key.1}", "headers": {"Authorization": "env:CRM"}},
    )
    assert config.resolved_headers({"CRM": "Bearer s"}) == {"Authorization": "Bearer s"}
    assert config.url_for("contact:a b/c") == "https://x/c/a%20b%2Fc"
    with pytest.raises(ConfigError, match="CRM") as refused:
        open_resource(config, {})
    assert "Bearer" not in str(refused.value)


def test_without_a_stamp_only_the_owned_fields_values_are_compared() -> None:
    # Given an API without versions and a record read by a lane
    with EtagServer(etags=False) as server, closing(http_resource(server, "stamped")) as crm:
        apply_versioned(crm, "contact:1", changes(count={"set": 1}), OWNS)
        read = crm.read("contact:1")
        # When a person edits a field the source does not own, Then the write still goes
        server.edit("contact:1", lambda f: {"notes": "called"})
        assert crm.update("contact:1", {"count": 2}, read) is not None
        # When a person edits an owned field after the read, Then the write is refused
        read = crm.read("contact:1")
        server.edit("contact:1", lambda f: {"count": 5})
        with pytest.raises(WriteConflict):
            crm.update("contact:1", {"count": 3}, read)
        assert server.fields("contact:1") == {"count": 5, "notes": "called"}


# -- APIs without versions: the window, measured ------------------------------------------


def measure_window(kind: str, edits_per_s: float, latency_s: float = 0.005) -> dict[str, Any]:
    """4 lanes apply 60 increments each (up to 20 attempts) while someone adds 1000 to the
    same (owned) field ``edits_per_s`` times a second; each outside edit is classed by where
    it landed in the server's log: between a lane's read and its check (caught: the lane
    re-reads), between the check and the write (missed: overwritten), or elsewhere (seen
    by the next read)."""
    keys = [f"contact:{n}" for n in range(4)]
    extra = {"stamp_at": "last_edited"} if kind == "stamped" else {}
    with EtagServer(etags=kind == "etag", delay_s=latency_s) as server:
        for key in keys:
            with closing(http_resource(server)) as first:
                apply_versioned(first, key, changes(count={"set": 0}), OWNS)
        stop, bumps = threading.Event(), Counter[str]()

        def outside() -> None:
            rng = random.Random(5)
            while not stop.wait(rng.expovariate(edits_per_s)):
                key = rng.choice(keys)
                server.edit(key, lambda f: {"count": f["count"] + 1000})
                bumps[key] += 1

        editor = threading.Thread(target=outside)
        editor.start()
        per_key = [changes(count={"increment": 1})] * 60
        results = run_lanes(
            keys, lambda key: per_key, lambda: http_resource(server, kind, **extra), 20
        )
        stop.set()
        editor.join(10)
        caught = missed = lost = 0
        for key in keys:
            applied = sum(isinstance(r, Written) for r in results[key])
            lost += applied + 1000 * bumps[key] - server.fields(key)["count"]
            spans = classify(server.ops_of(key), check_is_a_read=kind == "stamped")
            caught, missed = caught + spans[0], missed + spans[1]
    return {
        "kind": kind,
        "edits_per_s": edits_per_s,
        "edits": sum(bumps.values()),
        "caught": caught,
        "missed": missed,
        "lost": lost // 1000,
        "reviews": sum(isinstance(r, Review) for rs in results.values() for r in rs),
    }


def classify(ops: list[Any], check_is_a_read: bool) -> tuple[int, int]:
    """(caught, missed) outside edits of one record's log (see :func:`measure_window`).
    A stamped lane's requests go read, check, write; an ETag lane's check is its write."""
    caught = missed = pending = 0
    phase = "idle"
    for op in ops[1:]:  # after the set-up write
        if op.actor == "person":
            pending += 1
            continue
        if op.kind == "get" and check_is_a_read and phase == "read":
            caught, phase = caught + pending, "check"
        elif op.kind == "get":
            phase = "read"
        elif phase == "check":
            missed, phase = missed + pending, "idle"
        else:  # an ETag lane's conditional write: refused if anything landed since the read
            caught, phase = caught + pending, "idle"
        pending = 0
    return caught, missed


def test_without_versions_the_check_narrows_the_window_to_one_round_trip(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given an API with 5 ms latency per request, edited from outside at various rates
    runs = [
        measure_window("stamped", 20),
        measure_window("stamped", 200),
        measure_window("etag", 200),
    ]
    with capsys.disabled():
        print("\nkind     edits/s  outside edits  caught  missed (overwritten)  reviews")
        for r in runs:
            print(
                f"{r['kind']:8} {r['edits_per_s']:7g}  {r['edits']:13}  {r['caught']:6}  "
                f"{r['missed']:20}  {r['reviews']:7}"
            )
    for r in runs:
        # Then every overwritten edit is one the log shows landing between check and write
        assert r["lost"] == r["missed"], r
        assert r["reviews"] == 0  # (a review's last read would upset the classing)
    # and with versions nothing is ever missed
    assert runs[2]["missed"] == 0
    assert runs[2]["caught"] > 0
    assert runs[1]["caught"] + runs[1]["missed"] > 0


def test_the_readme_examples_are_valid_destinations() -> None:
    # Given the sources-file examples of the docs' page "Records that live elsewhere"
    section = page_text("records-elsewhere.md")
    examples = [block.split("```", 1)[0] for block in section.split("```toml")[1:]]
    kinds = {}
    for example in examples:
        data = tomllib.loads(example)
        if "sources" in data:  # a whole sources file: sources and what they name
            parse_sources(example, "records-elsewhere.md")
        for name, table in data["destinations"].items():
            kinds[name] = DestinationConfig(name=name, **table).kind
    # Then each destination parses as the kind it says
    assert kinds == {
        "contacts": "etag",
        "crm": "etag",
        "warehouse": "pg_table",
        "airtable": "stamped",
    }


def test_the_readme_warehouse_table_takes_keylane_writes(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    schema_url = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    # Given the page's CREATE TABLE, run as written where the URL's default schema is
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute(page_block("records-elsewhere.md", "CREATE TABLE contacts"))
    # And the page's [destinations.warehouse], its WAREHOUSE_URL pointing there
    example = page_block_containing("records-elsewhere.md", "[destinations.warehouse]")
    table = tomllib.loads(example)["destinations"]["warehouse"]
    config = DestinationConfig(name="warehouse", **table)
    assert config.resource is not None
    warehouse = open_resource(config.resource, {"WAREHOUSE_URL": schema_url})
    try:
        # When a change creates contact:42, and a second one changes it
        first = apply_versioned(
            warehouse,
            "contact:42",
            changes(email={"set": "a@b.c"}, visits={"increment": 1}, tags={"add": "vip"}),
        )
        second = apply_versioned(
            warehouse, "contact:42", changes(visits={"increment": 1}, tags={"append": "new"})
        )
    finally:
        warehouse.close()
    # Then the row keylane created started at revision 1, and each write moved it on
    assert isinstance(first, Written), first
    assert isinstance(second, Written), second
    assert (first.version, second.version) == (1, 2)
    with psycopg.connect(schema_url) as conn:
        row = conn.execute("SELECT id, email, visit_count, tags, revision FROM contacts").fetchone()
    assert row == ("42", "a@b.c", 2, ["vip", "new"], 2)
