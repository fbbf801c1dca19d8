"""``keylane records list``: records by key prefix and field values, a page at a time, on
both stores; and the command itself, run as a user runs it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keylane.ops.outside_edit import edit_record, parse_assignment
from keylane.routing.contract.errors import KeylaneError
from keylane.workers.store_rows import RecordQuery
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from keylane.workers.stores.sql_record_query import same_json
from keylane.workers.stores.sql_records import close_record
from tests.support.readme import keylane_command
from tests.support.stack import REPO


def _fill(store: SqlStore) -> None:
    edit_record(store, "crm:1", {"stage": "won", "amount": 10, "vip": True, "tags": ["a", "b"]})
    edit_record(store, "crm:2", {"stage": "lost", "amount": 10.0, "vip": 1, "owner": {"id": 7.0}})
    edit_record(store, "crm:3", {"stage": "won", "amount": 12, "owner": {"name": "ada", "id": 7}})
    edit_record(store, "crm:4", {"stage": "won", "note": None})
    edit_record(store, "crmx:1", {"stage": "won"})
    edit_record(store, "form:1", {"stage": "won", 'we"ird.name': "x"})


def _keys(store: SqlStore, **query: Any) -> list[str]:
    return [r.key for r in store.list_records(RecordQuery(**query)).records]


def test_a_prefix_lists_only_its_keys_in_key_order(store: SqlStore) -> None:
    # Given records under three prefixes
    _fill(store)
    # When they are listed by prefix
    # Then only keys starting with it (literally: "crm:" is not "crmx:"), in key order
    assert _keys(store, prefix="crm:") == ["crm:1", "crm:2", "crm:3", "crm:4"]
    assert _keys(store, prefix="crm") == ["crm:1", "crm:2", "crm:3", "crm:4", "crmx:1"]
    assert _keys(store) == ["crm:1", "crm:2", "crm:3", "crm:4", "crmx:1", "form:1"]
    assert _keys(store, prefix="%") == []


def test_where_compares_fields_as_json(store: SqlStore) -> None:
    # Given fields of every JSON kind
    _fill(store)
    crm = {"prefix": "crm:"}
    # Then text, numbers by value (10 is 10.0), true never 1, objects in any key order
    assert _keys(store, **crm, where=(("stage", "won"),)) == ["crm:1", "crm:3", "crm:4"]
    assert _keys(store, **crm, where=(("amount", 10),)) == ["crm:1", "crm:2"]
    assert _keys(store, **crm, where=(("amount", 10.0),)) == ["crm:1", "crm:2"]
    assert _keys(store, **crm, where=(("vip", True),)) == ["crm:1"]
    assert _keys(store, **crm, where=(("vip", 1),)) == ["crm:2"]
    assert _keys(store, **crm, where=(("tags", ["a", "b"]),)) == ["crm:1"]
    assert _keys(store, **crm, where=(("tags", ["b", "a"]),)) == []
    assert _keys(store, **crm, where=(("owner", {"id": 7, "name": "ada"}),)) == ["crm:3"]
    assert _keys(store, **crm, where=(("owner", {"id": 7}),)) == ["crm:2"]
    # And null matches a field that holds null, not one that is absent
    assert _keys(store, **crm, where=(("note", None),)) == ["crm:4"]
    # And every condition must hold; a field name is taken literally
    assert _keys(store, **crm, where=(("stage", "won"), ("amount", 12))) == ["crm:3"]
    assert _keys(store, where=(('we"ird.name', "x"),)) == ["form:1"]
    assert _keys(store, **crm, where=(("stage", "10"),)) == []
    assert _keys(store, **crm, where=(("amount", "10"),)) == []


def test_pages_are_full_until_the_last_and_say_where_the_next_starts(store: SqlStore) -> None:
    # Given seven matching records among others
    for n in range(10):
        edit_record(store, f"crm:{n}", {"stage": "won" if n % 3 else "lost"})
    query = {"prefix": "crm:", "where": (("stage", "won"),), "limit": 3}
    # When they are read a page at a time, each from where the last said
    pages, after = [], ""
    while True:
        page = store.list_records(RecordQuery(**query, after=after))  # type: ignore[arg-type]
        pages.append([r.key for r in page.records])
        if page.next_after is None:
            break
        after = page.next_after
    # Then every page but the last is full, and together they are every match once
    assert pages == [["crm:1", "crm:2", "crm:4"], ["crm:5", "crm:7", "crm:8"]]


def test_a_page_is_full_when_rows_the_sql_let_through_are_dropped(store: SqlStore) -> None:
    # Given objects that SQL alone may not tell apart from the one asked for (1.0 inside
    # an object is 1 to JSON, not to SQLite's text), between the ones that match
    for n in range(6):
        edit_record(store, f"o:{n}", {"o": {"x": [1, 2] if n % 2 else [1, 3]}})
    # When a page of two is asked for
    page = store.list_records(RecordQuery(where=(("o", {"x": [1.0, 2]}),), limit=2))
    # Then it holds two matches, and the next page the third
    assert [r.key for r in page.records] == ["o:1", "o:3"]
    rest = store.list_records(RecordQuery(where=(("o", {"x": [1, 2]}),), after="o:3"))
    assert ([r.key for r in rest.records], rest.next_after) == (["o:5"], None)


def test_a_page_that_ends_exactly_at_the_last_match_is_the_last(store: SqlStore) -> None:
    for n in range(4):
        edit_record(store, f"k:{n}", {"n": n})
    page = store.list_records(RecordQuery(prefix="k:", limit=4))
    assert [r.key for r in page.records] == ["k:0", "k:1", "k:2", "k:3"]
    assert page.next_after is None


def test_tombstones_are_left_out_unless_asked_for(store: SqlStore) -> None:
    # Given person:2 merged into person:1
    edit_record(store, "person:1", {"email": "a@b.c"})
    edit_record(store, "person:2", {"email": "a@b.c"})
    with store.dialect.transaction() as cur:
        close_record(cur, "person:2", "person:1")
    # Then the list shows the survivor only, and with merged both, the tombstone naming it
    assert _keys(store, prefix="person:") == ["person:1"]
    listed = store.list_records(RecordQuery(prefix="person:", merged=True)).records
    assert [(r.key, r.merged_into) for r in listed] == [
        ("person:1", None),
        ("person:2", "person:1"),
    ]


_SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from([1.0, 2.5])
_JSON = st.recursive(
    _SCALARS | st.text(max_size=2),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
    ),
    max_leaves=4,
)


@given(a=_JSON, b=_JSON)
def test_same_json_is_equality_of_the_json_text_read_back(a: Any, b: Any) -> None:
    # JSON's equality: what json.loads of either text gives, compared with numbers as
    # numbers and true apart from 1
    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None:
            return ("lit", v)
        if isinstance(v, int | float):
            return ("num", float(v))
        if isinstance(v, list):
            return ("list", tuple(norm(x) for x in v))
        if isinstance(v, dict):
            return ("obj", tuple(sorted((k, norm(x)) for k, x in v.items())))
        return ("text", v)

    assert same_json(a, b) == (norm(a) == norm(b))
    assert same_json(a, json.loads(json.dumps(a)))


# -- the command ------------------------------------------------------------------------


def _run(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env.update(PYTHONPATH=str(REPO), KEYLANE_STORE_URL=store_url)
    return subprocess.run(
        [*keylane_command(), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_keylane_records_list_pages_with_the_command_it_prints(store_url: str) -> None:
    # Given five won deals and a lost one
    store = open_store(store_url)
    store.migrate()
    for n in range(1, 7):
        edit_record(store, f"crm:{n}", {"stage": "lost" if n == 3 else "won", "amount": n})
    store.close()
    # When the first page of two is listed as text
    first = _run(
        store_url, "records", "list", "--prefix", "crm:", "--where", "stage=won", "--limit", "2"
    )
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    # Then a table of the page, and the command for the next page as its last line
    assert lines[0].split() == ["KEY", "REVISION", "UPDATED", "FIELDS"]
    assert lines[1].startswith("crm:1 ")
    assert 'amount=1 stage="won"' in lines[1]
    assert lines[2].startswith("crm:2 ")
    assert lines[-1] == (
        "next page: keylane records list --prefix crm: --where stage=won --limit 2 --after crm:2"
    )
    # And that command, run as printed, gives the next page, and so on to the last
    seen = [lines[1].split()[0], lines[2].split()[0]]
    command = lines[-1].removeprefix("next page: ")
    while command:
        page = _run(store_url, *shlex.split(command)[1:])
        assert page.returncode == 0, page.stderr
        rows = page.stdout.splitlines()
        command = rows[-1].removeprefix("next page: ") if rows[-1].startswith("next") else ""
        seen += [row.split()[0] for row in rows[1:] if not row.startswith("next page")]
    assert seen == ["crm:1", "crm:2", "crm:4", "crm:5", "crm:6"]
    # And --json is one document: the records as records get prints them, and the cursor
    shown = json.loads(_run(store_url, "records", "list", "--where", "amount=4", "--json").stdout)
    assert shown["next_after"] is None
    assert [(r["key"], r["fields"], r["revision"]) for r in shown["records"]] == [
        ("crm:4", {"amount": 4, "stage": "won"}, 1)
    ]
    # And `keylane records` alone is the first page of the list; nothing found says so
    assert _run(store_url, "records").stdout.splitlines()[1].startswith("crm:1 ")
    nothing = _run(store_url, "records", "list", "--prefix", "nope:")
    assert (nothing.returncode, nothing.stdout) == (0, "no records\n")


def test_a_where_value_that_json_has_not_is_refused_not_a_traceback() -> None:
    # Given values Python's json reads but JSON has not, and ones it has
    # Then NaN and Infinity are refused with what to do, quoted text and numbers are read
    for text in ("n=NaN", "n=Infinity", "n=-Infinity"):
        with pytest.raises(KeylaneError, match="not a JSON value"):
            parse_assignment(text)
    assert parse_assignment('n="NaN"') == ("n", "NaN")
    assert parse_assignment("n=1.5") == ("n", 1.5)
