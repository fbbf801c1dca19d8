"""A merge undone (``keylane merges undo``, workers/merge_undo.py, ops/undo_merge.py): the
survivor gives each field the merge took back to what it held before the merge, keeps a
field changed since and says by what, and never removes a value it cannot account for;
with real receiver and worker processes on both stores, and the identities page's example
run as written."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from keylane.ops.retention import prune
from keylane.routing.contract.identities import MERGE_SOURCE, GiveBack, merge_event_id
from keylane.routing.contract.message import build_event_message
from keylane.workers.merge_undo import gives_back_of, undone_fields
from keylane.workers.merges import merge_event
from keylane.workers.store_rows import DeadLetterFilter, JournalEntry
from keylane.workers.stores.sql import SqlStore
from tests.support.readme import page_block
from tests.support.stack import Stack, wait_until
from tests.test_merges import OWNING_SOURCES

DAY = 86400
BOB, CRM = "person:bob@example.com", "crm:9"


def _post(stack: Stack, event_id: str, record_key: str, **changes: Any) -> None:
    body = {"id": event_id, "type": "test", "record_key": record_key, "changes": changes}
    if event_id == "bob-1":
        body["also"] = ["email:bob@example.com"]
    if event_id == "crm-9":
        body["also"] = ["email:bob@example.com", "crm_id:9"]
    answer = stack.post(body)
    assert answer.status_code == 202, answer.text


def _wait(stack: Stack, ready: Any, what: str) -> None:
    wait_until(ready, 120, what, on_timeout=stack.logs, interval_s=0.1)


def _applied(stack: Stack, store: SqlStore, event_id: str) -> None:
    _wait(stack, lambda: store.journal("demo", event_id) is not None, event_id)


def _bob_and_the_crm(stack: Stack) -> tuple[SqlStore, int]:
    """Bob told by a form (name Bob, plan pro), then a CRM contact naming his email (name
    Robert, a phone, a CRM id): their merge's review row, waiting for a person."""
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    store = stack.open_store()
    _post(stack, "bob-1", BOB, name={"set": "Bob"}, plan={"set": "pro"})
    _applied(stack, store, "bob-1")
    crm = {"name": {"set": "Robert"}, "phone": {"set": "+15550100999"}, "crm_id": {"set": "9"}}
    _post(stack, "crm-9", CRM, **crm)
    _wait(stack, lambda: bool(store.dead_letters(DeadLetterFilter())), "the review row")
    (row,) = store.dead_letters(DeadLetterFilter())
    assert row.attempted_change["survivor"]["key"] == BOB
    return store, row.id


def _resolved(stack: Stack, store: SqlStore, row_id: int) -> None:
    """The review resolved with the CRM's name, and the merge absorbed."""
    done = stack.keylane("merges", "resolve", str(row_id), "--take", "name=absorbed")
    assert done.returncode == 0, done.stdout + done.stderr
    _wait(stack, lambda: store.read(BOB).fields.get("crm_id") == "9", "the absorb")
    assert store.read(BOB).fields == {
        "name": "Robert",
        "plan": "pro",
        "phone": "+15550100999",
        "crm_id": "9",
    }


def _undo_json(stack: Stack, absorbed: str = CRM) -> dict[str, Any]:
    done = stack.keylane("merges", "undo", absorbed, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.slow
def test_an_undo_after_a_resolve_gives_the_survivor_back_its_own_value(stack: Stack) -> None:
    # Given Bob merged with the CRM's contact, a person having kept the CRM's name
    store, row_id = _bob_and_the_crm(stack)
    _resolved(stack, store, row_id)
    # When the merge is undone
    undone = _undo_json(stack)
    # Then Bob has his own name back, and what he lacked before the merge is gone again
    assert store.read(BOB).fields == {"name": "Bob", "plan": "pro"}
    assert undone["outcome"] == "released"
    assert undone["restored"] == {"name": "Bob"}
    assert undone["removed"] == ["crm_id", "phone"]
    assert (undone["kept"], undone["unknown"]) == ({}, {})
    # And the CRM's contact is live again with its own fields and identity
    crm = store.read(CRM)
    assert crm.merged_into is None
    assert crm.fields == {"name": "Robert", "phone": "+15550100999", "crm_id": "9"}
    assert store.identities_of(CRM) == ["crm_id:9"]
    assert store.identities_of(BOB) == ["email:bob@example.com"]
    assert store.kept_apart(CRM, BOB)


@pytest.mark.slow
def test_a_field_an_event_changed_between_the_merge_and_the_undo_is_kept_and_said(
    stack: Stack,
) -> None:
    # Given Bob merged with the CRM's contact, a person having kept the CRM's name
    store, row_id = _bob_and_the_crm(stack)
    _resolved(stack, store, row_id)
    # And the CRM renames its contact since (forwarded to Bob's record: they are one)
    _post(stack, "crm-10", CRM, name={"set": "Bobby"})
    _applied(stack, store, "crm-10")
    assert store.read(BOB).fields["name"] == "Bobby"
    # When the merge is undone
    done = stack.keylane("merges", "undo", CRM)
    assert done.returncode == 0, done.stdout + done.stderr
    # Then the later name stays, and the undo says so and by which event
    assert store.read(BOB).fields == {"name": "Bobby", "plan": "pro"}
    lines = done.stdout.splitlines()
    released = f"released: {CRM} out of {BOB}, kept apart for good; identities back: crm_id:9"
    assert lines[0] == released
    rows = {line.split()[0]: line.split(None, 3)[1:] for line in lines[2:]}
    assert rows == {
        "crm_id": ["(absent)", "removed", "it had none before the merge"],
        "name": ['"Bobby"', "kept", "changed since the merge, by demo/crm-10"],
        "phone": ["(absent)", "removed", "it had none before the merge"],
    }
    # And the release's journal entry says the same
    (release,) = [e for e in store.journal_entries(BOB) if e.event_id.startswith("release-")]
    assert release.result is not None
    assert release.result["kept"] == {
        "name": {"value": "Bobby", "by": "demo/crm-10",
                 "why": "changed since the merge, by demo/crm-10"},
    }  # fmt: skip
    assert release.result["restored"] == {}


@pytest.mark.slow
def test_the_identities_pages_undo_example_runs_as_written(stack: Stack) -> None:
    # Given a receiver and a worker on the port the page's curl uses
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    store = stack.open_store()
    block = page_block("identities.md", "curl -s localhost:8000/webhooks/demo -H 'content-type")
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("# "):
            steps[-1][1].append(line[2:])
        else:
            steps.append((line, []))
    # When each line runs as written, once the one before it has been applied
    for line, shown in steps:
        if line.startswith("curl"):
            host = stack.url.removeprefix("http://")
            sent = subprocess.run(
                ["bash", "-c", line.replace("localhost:8000", host)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert '"accepted"' in sent.stdout, sent
            found = re.search(r'"id": "([^"]+)"', line)
            assert found is not None
            _applied(stack, store, found.group(1))
            if found.group(1) == "crm-9":
                _wait(stack, lambda: bool(store.dead_letters(DeadLetterFilter())), "review")
            continue
        done = stack.keylane(*shlex.split(line, comments=True)[1:])
        assert done.returncode == 0, line + done.stdout + done.stderr
        # Then each command prints what the page shows
        if shown:
            assert done.stdout.splitlines() == shown, line
        if " resolve " in line:
            _wait(stack, lambda: "crm_id" in store.read(BOB).fields, "the absorb")
    # And the records are as the page says
    assert store.read(BOB).fields == {"name": "Bob", "phone": "+15550100777", "plan": "pro"}
    assert store.read(CRM).fields == {"name": "Robert", "phone": "+15550100999", "crm_id": "9"}
    assert store.read(CRM).merged_into is None
    assert store.identities_of(CRM) == ["crm_id:9"]


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_automatic_merge_that_field_ownership_decided_gives_the_value_back_too(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a form (any field) and a CRM that owns company (among others) by name
    stack.use_sources(OWNING_SOURCES)
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    store = stack.open_store()
    # When the form says Acme about Bob, then the CRM says Globex about his email
    form = {"id": "f-1", "type": "t", "record_key": BOB, "also": ["email:bob@example.com"],
            "changes": {"company": {"set": "Acme"}}}  # fmt: skip
    assert stack.post(form, source="form").status_code == 202
    _wait(stack, lambda: store.journal("form", "f-1") is not None, "the form's event")
    crm = {"id": "c-1", "type": "t", "record_key": CRM, "also": ["email:bob@example.com"],
           "changes": {"company": {"set": "Globex"}}}  # fmt: skip
    assert stack.post(crm, source="crm").status_code == 202
    # Then the merge needs no person: the CRM's company replaces Bob's
    _wait(stack, lambda: store.read(BOB).fields.get("company") == "Globex", "the merge")
    assert store.dead_letters(DeadLetterFilter()) == []
    # And undone, Bob has his own company back
    undone = _undo_json(stack)
    assert undone["restored"] == {"company": "Acme"}
    assert store.read(BOB).fields == {"company": "Acme"}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_absorb_the_prune_archived_is_read_from_the_archive(stack: Stack) -> None:
    # Given Bob merged with the CRM's contact (a person kept the CRM's name), and a prune
    # 40 days later that archived the merge's journal rows and its closed review row
    store, row_id = _bob_and_the_crm(stack)
    _resolved(stack, store, row_id)
    prune(stack.settings, store, store, None, now=time.time() + 40 * DAY)
    assert not [e for e in store.journal_entries() if e.event_id.startswith("absorb-")]
    assert store.dead_letter(row_id) is None
    # When the merge is undone
    undone = _undo_json(stack)
    # Then what the survivor had before was read from the archived absorb
    assert undone["restored"] == {"name": "Bob"}
    assert store.read(BOB).fields == {"name": "Bob", "plan": "pro"}
    assert store.read(CRM).merged_into is None


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_absorb_journaled_before_it_kept_what_it_replaced_uses_the_review_row(
    stack: Stack,
) -> None:
    # Given Bob merged with the CRM's contact (a person kept the CRM's name), by a keylane
    # whose absorbs did not keep what they replaced
    store, row_id = _bob_and_the_crm(stack)
    _resolved(stack, store, row_id)
    (absorb,) = [e for e in store.journal_entries(BOB) if e.event_id.startswith("absorb-")]
    assert absorb.result is not None
    assert absorb.result["replaced"] == {"name": "Bob"}
    before = {k: v for k, v in absorb.result.items() if k != "replaced"}
    with store.dialect.transaction() as cur:
        cur.execute(
            "UPDATE journal SET result = ? WHERE event_id = ?",
            (json.dumps(before), absorb.event_id),
        )
    # When the merge is undone while the review row is there
    undone = _undo_json(stack)
    # Then the review row says Bob's name before; what no one chose, he lacked
    assert undone["restored"] == {"name": "Bob"}
    assert undone["removed"] == ["crm_id", "phone"]
    assert store.read(BOB).fields == {"name": "Bob", "plan": "pro"}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_reopen_queued_without_what_it_gives_back_reads_it_from_the_journal(
    stack: Stack,
) -> None:
    # Given Bob merged with the CRM's contact (a person kept the CRM's name)
    store, row_id = _bob_and_the_crm(stack)
    _resolved(stack, store, row_id)
    # When a reopen that does not carry what the survivor gives back is queued (as a
    # command from before undo steps carried it queued one)
    broker = stack.broker()
    try:
        event = merge_event(broker.shards, "reopen", CRM, BOB, None, row_id)
        assert event.merge is not None
        assert event.merge.gives_back is None
        raw = build_event_message(event, broker.shards.queue_name(event.shard))
        assert broker.push_once("undo:old", event.shard, raw)
    finally:
        broker.close()
    # Then the release read it from the absorb's journal entry: Bob's name is his again
    release_id = merge_event_id(CRM, BOB, "release", row_id)
    _wait(stack, lambda: store.journal(MERGE_SOURCE, release_id) is not None, "the release")
    release = store.journal(MERGE_SOURCE, release_id)
    assert release is not None
    assert release.result is not None
    assert (release.result["restored"], release.result["removed"]) == (
        {"name": "Bob"},
        ["crm_id", "phone"],
    )
    assert store.read(BOB).fields == {"name": "Bob", "plan": "pro"}


def test_an_absorb_from_before_without_its_review_row_says_what_nothing_else_does(
    store: SqlStore,
) -> None:
    # Given an absorb journaled before absorbs kept what they replaced, of a merge a person
    # resolved (review row 7, pruned since) taking the CRM's name; it took the phone too
    absorb = JournalEntry(
        MERGE_SOURCE, merge_event_id(CRM, BOB, "absorb", 7), BOB, 1, "applied", 2, 1, 0.0,
        result={"absorbed": CRM, "fields": {"name": "Robert", "phone": "+1"},
                "identities": ["crm_id:9"], "kept": {}},
    )  # fmt: skip
    close_id = merge_event_id(CRM, BOB, "close", 7)
    close = JournalEntry(MERGE_SOURCE, close_id, CRM, 1, "applied", 2, 1, 0.0,
                         result={"merged_into": BOB, "take": {"name": "absorbed"}})  # fmt: skip
    # When what the undo gives back is read with the close's choices at hand
    back = gives_back_of(absorb, {close_id: close}.get, store)
    # Then the phone was taken because Bob had none; the name's value before is unknown
    assert (back.took, back.replaced, back.unknown) == (absorb.result["fields"], {}, ("name",))
    assert (back.identities, back.revision) == (("crm_id:9",), 2)
    # And with the close gone too, nothing says what Bob had of either
    assert gives_back_of(absorb, {}.get, store).unknown == ("name", "phone")


def test_a_field_whose_value_before_nothing_says_is_left_and_said() -> None:
    # Given an absorb from before absorbs kept what they replaced, with no review row
    back = GiveBack(took={"name": "Robert", "phone": "+1"}, unknown=("name",), revision=2)
    # When the survivor gives it back, holding what it took
    fields, undone = undone_fields({"name": "Robert", "phone": "+1", "plan": "pro"}, back, {})
    # Then the name is left as it is and said unknown; the phone, which it lacked, goes
    assert fields == {"name": "Robert", "plan": "pro"}
    assert undone["unknown"] == {"name": "Robert"}
    assert (undone["restored"], undone["removed"], undone["kept"]) == ({}, ["phone"], {})


def test_a_field_changed_by_an_outside_edit_is_kept_with_no_event_named() -> None:
    back = GiveBack(took={"name": "Robert"}, replaced={"name": "Bob"}, revision=2)
    fields, undone = undone_fields({"name": "Rob"}, back, {})
    assert fields == {"name": "Rob"}
    why = "changed since the merge, by no event in the journal"
    assert undone["kept"] == {"name": {"value": "Rob", "by": None, "why": why}}
    # And one removed since is kept removed
    fields, undone = undone_fields({}, back, {"name": "demo/e-7"})
    assert fields == {}
    why = "removed since the merge, by demo/e-7"
    assert undone["kept"] == {"name": {"by": "demo/e-7", "why": why}}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_chain_is_undone_last_merge_first_and_each_record_gets_back_what_it_had(
    stack: Stack,
) -> None:
    # Given c, b and a, created in that order; a merged into b, then b into c
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    store = stack.open_store()
    for key in "cba":
        first = {"id": f"{key}-0", "type": "t", "record_key": f"chain:{key}",
                 "also": [f"crm_id:{key}"], "changes": {key: {"set": True}}}  # fmt: skip
        assert stack.post(first).status_code == 202
        _applied(stack, store, f"{key}-0")
    for one, other in ("ab", "bc"):
        link = {"id": f"link-{one}{other}", "type": "t", "record_key": f"chain:{one}",
                "also": [f"crm_id:{one}", f"crm_id:{other}"],
                "changes": {f"{one}_linked": {"set": True}}}  # fmt: skip
        assert stack.post(link).status_code == 202

        def absorbed(o: str = one, t: str = other) -> bool:
            return o in store.read(f"chain:{t}").fields

        _wait(stack, absorbed, f"chain:{one} absorbed")
    assert store.read("chain:c").fields.keys() == {"a", "a_linked", "b", "b_linked", "c"}
    # When a's merge is undone first, Then it is refused: b's merge into c goes first
    refused = stack.keylane("merges", "undo", "chain:a")
    assert refused.returncode != 0
    assert "undo that merge first (keylane merges undo chain:b)" in refused.stderr
    assert store.read("chain:a").merged_into == "chain:b"
    # And undone last merge first, each record has what it had before its merge
    assert _undo_json(stack, "chain:b")["removed"] == ["a", "a_linked", "b", "b_linked"]
    assert _undo_json(stack, "chain:a")["removed"] == ["a", "a_linked"]
    for key, fields in {"a": {"a", "a_linked"}, "b": {"b", "b_linked"}, "c": {"c"}}.items():
        assert store.read(f"chain:{key}").fields.keys() == fields
        assert store.read(f"chain:{key}").merged_into is None
        assert store.identities_of(f"chain:{key}") == [f"crm_id:{key}"]
