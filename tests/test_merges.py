"""Identities and merges (``workers/merges.py``): one record from two when senders name one
entity differently, through both records' lanes, with real receiver and worker processes;
the store's part (the identity index written with the record, a tombstone never written
again) against both stores."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from keylane.ops.reconcile import live_records
from keylane.routing.contract.errors import RecordMerged
from keylane.routing.contract.identities import (
    check_identities,
    normal_identity,
    survivor_first,
)
from keylane.workers.lane_store import event_write
from keylane.workers.merges import live_end
from keylane.workers.store import JournalStore, RecordStore
from keylane.workers.store_rows import DeadLetterFilter, JournalEntry, Record
from keylane.workers.stores.sql import SqlStore
from tests.support.lane_parts import lane_event
from tests.support.people import (
    TASK_SOURCES,
    check_task_merges,
    crm_contacts,
    crm_events,
    form_events,
    kill_during_merges,
    one_record,
    person,
    post_to_the_task,
    send_in_order,
    streamed_in,
    task_deployment,
    told_to_the_task,
)
from tests.support.stack import Stack, wait_until

# -- identities: one normal form per kind ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("email: Ann.Lee@Example.COM ", "email:ann.lee@example.com"),
        ("phone:+44 20 7946-0958", "phone:+442079460958"),
        ("phone:0044 (20) 7946 0958", "phone:+442079460958"),
        ("crm_id:  A-17 ", "crm_id:A-17"),
        ("email:", None),
    ],
)
def test_an_identity_is_written_in_one_normal_form(raw: str, normal: str | None) -> None:
    assert normal_identity(raw) == normal


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("ann@example.com", "kind:value"),
        ("email:ann", "not an email address"),
        ("phone:2079460958", "E.164"),
        (42, "text"),
    ],
)
def test_an_identity_that_cannot_be_read_says_why(raw: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        normal_identity(raw)


def test_a_source_names_the_rule_of_its_own_kinds() -> None:
    assert check_identities(["mobile:+1 555 0100 200", "mobile:+15550100200"], {"mobile": "phone"})
    assert check_identities(["handle:Ann", "handle:ANN"], {"handle": "lower"}) == ("handle:ann",)


def test_the_older_record_survives_and_equal_times_fall_to_the_lower_key() -> None:
    assert survivor_first(("b", 1.0), ("a", 2.0)) == ("b", "a")
    assert survivor_first(("b", 1.0), ("a", 1.0)) == ("a", "b")
    assert survivor_first(("b", None), ("a", 5.0)) == ("b", "a")


# -- the store: the index is written with the record, a tombstone never again -----------


def test_identities_are_claimed_in_the_records_write_and_the_first_claim_stands(
    store: SqlStore,
) -> None:
    # Given two records written by events that both name email:a@x
    first = event_write(lane_event("e1", "p:1"), {"n": 1}, 0, 1)
    second = event_write(lane_event("e2", "p:2"), {"n": 2}, 0, 1)
    store.commit_event(_claiming(first, "email:a@x", "phone:+15550100200"), None)
    store.commit_event(_claiming(second, "email:a@x"), None)
    # Then the identity names the record that claimed it first
    owners = store.identity_owners(["email:a@x", "phone:+15550100200", "email:none@x"])
    assert owners == {"email:a@x": "p:1", "phone:+15550100200": "p:1"}
    assert store.identities_of("p:2") == []


def test_a_write_refused_by_its_revision_claims_nothing(store: SqlStore) -> None:
    store.commit_event(event_write(lane_event("e1", "p:1"), {"n": 1}, 0, 1), None)
    stale = _claiming(event_write(lane_event("e2", "p:1"), {"n": 2}, 0, 1), "email:a@x")
    with pytest.raises(Exception, match="revision"):
        store.commit_event(stale, None)
    assert store.identity_owners(["email:a@x"]) == {}


def test_a_closed_record_is_a_tombstone_that_is_never_written_again(store: SqlStore) -> None:
    # Given p:2 closed into p:1 (its identities moved there by the absorb)
    store.commit_event(_claiming(event_write(lane_event("e1", "p:1"), {"a": 1}, 0, 1)), None)
    store.commit_event(
        _claiming(event_write(lane_event("e2", "p:2"), {"b": 2}, 0, 1), "phone:+15550100200"),
        None,
    )
    close = event_write(lane_event("c", "p:2"), {"b": 2}, 1, 1)
    store.commit_event(_replace(close, merged_into="p:1"), None)
    absorb = event_write(lane_event("a", "p:1"), {"a": 1, "b": 2}, 1, 1)
    store.commit_event(_replace(absorb, absorbs="p:2"), None)
    # Then p:2 names its survivor, keeps its fields, and refuses every write
    tombstone = store.read("p:2")
    assert (tombstone.merged_into, tombstone.fields, tombstone.revision) == ("p:1", {"b": 2}, 2)
    with pytest.raises(RecordMerged, match="merged into 'p:1'"):
        store.commit_event(event_write(lane_event("e3", "p:2"), {"b": 3}, 2, 1), None)
    assert store.identity_owners(["phone:+15550100200"]) == {"phone:+15550100200": "p:1"}
    assert live_end(store, "p:2").key == "p:1"
    assert store.read("p:1").created_at is not None


def _claiming(write: Any, *identities: str) -> Any:
    return _replace(write, identities=identities)


def _replace(write: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(write, **changes)


# -- through the lanes: the two-door race -------------------------------------------------


def _merged(stack: Stack, store: RecordStore, n: int) -> Record:
    """Person ``n``'s one record, once the survivor absorbed the other (a close alone
    already makes both keys end in one record): it holds both senders' fields."""

    def absorbed() -> bool:
        record = one_record(store, n)
        return record is not None and {"form_seq", "crm_seq"} <= record.fields.keys()

    _wait(stack, absorbed, f"person {n}'s merge")
    record = one_record(store, n)
    assert record is not None
    return record


def _person_merged(stack: Stack, **worker_env: Any) -> tuple[SqlStore, Record]:
    """Person 1 told by the form (email) first, then by the CRM (phone, its last event
    linking the email), through a receiver and a worker of 4 lanes (``worker_env``): the
    store, and the record the two merged into."""
    stack.receiver()
    stack.worker(lanes=4, **worker_env)
    stack.wait_all_owned()
    send_in_order(stack, [form_events(1)], senders=1)
    stack.wait_journal(2)
    send_in_order(stack, [crm_events(1)], senders=1)
    store = stack.open_store()
    return store, _merged(stack, store, 1)


def _wait(stack: Stack, ready: Callable[[], bool], what: str) -> None:
    wait_until(ready, 120, what, on_timeout=stack.logs, interval_s=0.2)


@pytest.mark.slow
def test_fifty_people_named_by_email_and_by_phone_end_as_fifty_records(stack: Stack) -> None:
    # Given a receiver and two workers (one on SQLite: it takes one writer)
    stack.receiver()
    for _ in range(stack.writers(2)):
        stack.worker(lanes=8)
    stack.wait_all_owned()
    people = range(50)
    # When a form (email) and the CRM (phone, then a link of both) announce each person,
    # every sender in its own order and all of them at once
    sequences = [form_events(n) for n in people] + [crm_events(n) for n in people]
    send_in_order(stack, sequences, senders=16)
    # Then each person is one record, with every field from both senders
    store = stack.open_store()

    def absorbed(n: int) -> bool:  # both keys end in one record that holds every field
        record = one_record(store, n)
        return record is not None and len(record.fields) == 6

    _wait(stack, lambda: all(absorbed(n) for n in people), "50 merged records")
    _wait(stack, lambda: store.journal_size() >= 250 + 100, "every event and merge step")
    for n in people:
        record = one_record(store, n)
        assert record is not None
        email, phone = person(n)
        assert record.fields == {
            "name": f"Person {n}",
            "email": email,
            "phone": phone,
            "company": f"Co {n % 7}",
            "form_seq": [1, 2],  # in order per sender
            "crm_seq": [1, 2, 3],
        }, record
        assert set(store.identities_of(record.key)) == {f"email:{email}", f"phone:{phone}"}
    live = [r for r in store.scan_records("person:", limit=1000) if r.merged_into is None]
    assert len(live) == 50
    # And every event applied exactly once, each merge closed and absorbed once
    entries = store.journal_entries()
    demo = [e for e in entries if e.source == "demo"]
    assert len(demo) == 250
    assert {e.outcome for e in demo} == {"applied"}
    steps = [e for e in entries if e.source == "keylane.merge"]
    closes = [e for e in steps if e.event_id.startswith("close-") and e.result
              and "merged_into" in e.result]  # fmt: skip
    absorbs = [e for e in steps if e.event_id.startswith("absorb-")]
    assert len(closes) == 50
    assert len(absorbs) == 50
    assert store.dead_letters(DeadLetterFilter()) == []


def test_a_merge_whose_records_differ_is_reviewed_and_both_records_go_on(stack: Stack) -> None:
    # Given a person the form says works at Acme and the CRM at Globex
    store, row_id, globex = _reviewed_pair(stack)
    # Then nothing is merged: a review row shows both sides of the field that differs
    row = store.dead_letter(row_id)
    assert row is not None
    assert (row.reason, row.status) == ("merge_review", "open")
    acme = "survivor" if globex == "absorbed" else "absorbed"
    assert row.attempted_change["differ"] == {"company": {globex: "Globex", acme: "Acme"}}
    email, phone = person(1)
    assert store.read(f"person:{email}").merged_into is None
    assert store.read(f"person:{phone}").merged_into is None
    # And both records go on receiving their own events
    answer = stack.post(
        {"id": "form-1-3", "record_key": f"person:{email}", "changes": {"form_seq": {"append": 3}}}
    )
    assert answer.status_code == 202
    _wait(stack, lambda: store.read(f"person:{email}").fields["form_seq"] == [1, 2, 3], "form-1-3")
    shown = stack.keylane("dlq", "show", str(row.id))
    assert shown.returncode == 0, shown.stderr
    assert "Globex" in shown.stdout
    assert f"keylane merges resolve {row.id}" in shown.stdout


@pytest.mark.slow
def test_records_get_of_an_absorbed_key_says_where_it_went(stack: Stack) -> None:
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    send_in_order(stack, [form_events(2), crm_events(2)], senders=2)
    store = stack.open_store()
    _wait(stack, lambda: one_record(store, 2) is not None, "the merge")
    survivor = one_record(store, 2)
    assert survivor is not None
    email, phone = person(2)
    absorbed = f"person:{phone}" if survivor.key.endswith(email) else f"person:{email}"
    shown = stack.keylane("records", "get", absorbed, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["merged_into"] == survivor.key
    text = stack.keylane("records", "get", absorbed)
    assert f"merged into {survivor.key}" in text.stdout
    # And status and /metrics count it
    _wait(stack, lambda: _status(stack)["merges"]["applied"] == 1, "the merge counted")
    merges = _status(stack)["merges"]
    assert (merges["pending_review"], merges["kept_apart"]) == (0, 0)
    metrics = httpx.get(f"{stack.ops_url}/metrics", timeout=10).text
    assert "keylane_merges_total 1.0" in metrics


def _status(stack: Stack) -> dict[str, Any]:
    answer = stack.keylane("status", "--json")
    assert answer.returncode == 0, answer.stderr
    return dict(json.loads(answer.stdout))


def _reviewed_pair(stack: Stack) -> tuple[SqlStore, int, str]:
    """Person 1 told by the form (Acme) and the CRM (Globex): the merge's review row id,
    and the side whose record holds Globex."""
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    form = form_events(1)
    form[0]["changes"]["company"] = {"set": "Acme"}
    send_in_order(stack, [form, crm_events(1, company="Globex")], senders=2)
    store = stack.open_store()
    _wait(stack, lambda: bool(store.dead_letters(DeadLetterFilter())), "the merge's review row")
    (row,) = store.dead_letters(DeadLetterFilter())
    globex = next(s for s, v in row.attempted_change["differ"]["company"].items() if v == "Globex")
    return store, row.id, globex


@pytest.mark.slow
def test_a_reviewed_merge_resolved_per_field_applies_exactly_that(stack: Stack) -> None:
    # Given a merge reviewed because company differs
    store, row_id, globex = _reviewed_pair(stack)
    shown = stack.keylane("merges", "show", str(row_id))
    assert shown.returncode == 0, shown.stderr
    assert "Acme" in shown.stdout
    assert "Globex" in shown.stdout
    # When a person keeps the CRM's company, choosing nothing else
    unchosen = stack.keylane("merges", "resolve", str(row_id))
    assert unchosen.returncode != 0
    assert "choose a side for company" in unchosen.stderr
    done = stack.keylane("merges", "resolve", str(row_id), "--take", f"company={globex}")
    assert done.returncode == 0, done.stderr
    # Then the two are one record with Globex and every other field of both
    record = _merged(stack, store, 1)
    assert record.fields["company"] == "Globex"
    assert record.fields["form_seq"] == [1, 2]
    assert record.fields["crm_seq"] == [1, 2, 3]
    row = store.dead_letter(row_id)
    assert row is not None
    assert row.status == "resolved"
    assert row.note == f"merge: company={globex}"


@pytest.mark.slow
def test_a_pair_kept_apart_is_never_proposed_again(stack: Stack) -> None:
    # Given a merge reviewed, and a person who says the two are two people
    store, row_id, _ = _reviewed_pair(stack)
    apart = stack.keylane("merges", "apart", str(row_id), "--note", "two Ann Lees")
    assert apart.returncode == 0, apart.stderr
    # When the CRM links the phone and the email again, and both records get events after
    email, phone = person(1)
    link = {
        "id": "crm-1-4",
        "record_key": f"person:{phone}",
        "also": [f"phone:{phone}", f"email:{email}"],
        "changes": {"crm_seq": {"append": 4}},
    }
    after = [
        {"id": "crm-1-5", "record_key": f"person:{phone}", "changes": {"crm_seq": {"append": 5}}},
        {"id": "form-1-3", "record_key": f"person:{email}", "changes": {"form_seq": {"append": 3}}},
    ]  # fmt: skip
    send_in_order(stack, [[link, *after]], senders=1)
    _wait(stack, lambda: store.journal("demo", "form-1-3") is not None, "the last events")
    _wait(stack, lambda: store.journal("demo", "crm-1-5") is not None, "the last events")
    # Then no merge was proposed: the one review row, closed, and two live records
    assert [r.id for r in store.dead_letters(DeadLetterFilter())] == [row_id]
    merges = [e for e in store.journal_entries() if e.source == "keylane.merge"]
    assert len(merges) == 1
    assert store.read(f"person:{email}").merged_into is None
    assert store.read(f"person:{phone}").fields["crm_seq"] == [1, 2, 3, 4, 5]
    assert store.kept_apart(f"person:{phone}", f"person:{email}")


# -- a merge undone -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_merge_undone_gives_each_record_back_what_it_had_and_keeps_them_apart(
    stack: Stack,
) -> None:
    # Given a person merged from a form's record (email, told first) and the CRM's (phone,
    # its last event linking the email: the CRM's record is closed with all its events)
    store, merged = _person_merged(stack)
    email, phone = person(1)
    absorbed = f"person:{phone}"
    assert merged.key == f"person:{email}"
    closed = store.read(absorbed)
    assert closed.merged_into == merged.key
    # When a person undoes it
    done = stack.keylane("merges", "undo", absorbed)
    assert done.returncode == 0, done.stdout + done.stderr
    # Then it waits for the release and says what went back: the survivor lacked each
    # field it took (the identities page runs one that restores a value of its own:
    # tests/test_merge_undo.py)
    lines = done.stdout.splitlines()
    back = "kept apart for good; identities back: phone:+15550100001"
    assert lines[0] == f"released: {absorbed} out of {merged.key}, {back}"
    assert [line.split()[:3] for line in lines[2:]] == [
        [name, "(absent)", "removed"] for name in ("company", "crm_seq", "phone")
    ]
    # Then the absorbed record is live again with its fields as the close left them, the
    # survivor has given back what it took, and the identities that came with the absorbed
    # record (those it held at its close) are its own again
    assert _release(store, absorbed) is not None
    assert store.read(absorbed).merged_into is None
    assert store.read(absorbed).fields == closed.fields
    survivor = store.read(merged.key)
    assert survivor.fields == {"name": "Person 1", "email": email, "form_seq": [1, 2]}
    _check_released(store, absorbed, merged.key)
    both = {f"email:{email}", f"phone:{phone}"}
    assert set(store.identities_of(absorbed)) | set(store.identities_of(merged.key)) == both
    (absorb,) = [e for e in store.journal_entries(merged.key) if e.event_id.startswith("absorb-")]
    assert absorb.result is not None
    assert store.identities_of(absorbed) == sorted(absorb.result["identities"])
    assert store.kept_apart(absorbed, merged.key)
    _wait(stack, lambda: _status(stack)["merges"]["undone"] == 1, "the undo counted")
    # And an event of the reopened key is applied to it, and one naming both identities
    # proposes no merge again
    link = {"id": "relink", "record_key": absorbed, "also": sorted(both),
            "changes": {"relinked": {"set": True}}}  # fmt: skip
    assert stack.post({"type": "test", **link}).status_code == 202
    _wait(stack, lambda: store.read(absorbed).fields.get("relinked") is True, "the relink")
    assert store.read(absorbed).merged_into is None
    closes = [e for e in store.journal_entries() if e.event_id.startswith("close-")]
    assert len(closes) == 1
    # And a second undo says there is nothing to undo
    again = stack.keylane("merges", "undo", absorbed)
    assert again.returncode != 0
    assert "not merged into another record" in again.stdout + again.stderr


def test_an_absorb_and_its_release_that_meet_outside_edits_read_again_and_count_them(
    stack: Stack,
) -> None:
    # Given a worker where the survivor's absorb, and later its release, each meet an
    # outside edit of the survivor on their first two writes
    bumps = [
        {"point": point, "action": "bump", "match": "person:", "times": 2}
        for point in ("merge.absorbing", "merge.releasing")
    ]
    # When a person is told by the form, then by the CRM
    store, merged = _person_merged(stack, faults=bumps)
    # Then the absorb was written on its third read, and its two conflicts are counted
    (absorb,) = [e for e in store.journal_entries(merged.key) if e.event_id.startswith("absorb-")]
    assert absorb.attempts == 3
    _wait(stack, lambda: stack.view().counters().get("conflicts") == 2, "2 conflicts counted")
    # When the merge is undone
    absorbed = f"person:{person(1)[1]}"
    done = stack.keylane("merges", "undo", absorbed)
    assert done.returncode == 0, done.stdout + done.stderr
    # Then the release too was written on its third read, gave back what the absorb took,
    # and its conflicts are counted as the absorb's are
    _wait(stack, lambda: _release(store, absorbed) is not None, "the release")
    release = _release(store, absorbed)
    assert release is not None
    assert release.attempts == 3
    _check_released(store, absorbed, merged.key)
    _wait(stack, lambda: stack.view().counters().get("conflicts") == 4, "4 conflicts counted")


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("point", ["merge.reopened", "worker.after_send"])
def test_a_worker_killed_during_an_undo_leaves_it_done_once(stack: Stack, point: str) -> None:
    # Given 5 people merged, and a worker that dies (kill -9) at this step of the first
    # undo it runs (merge.reopened: the record is live again, its release not queued yet;
    # worker.after_send: the release queued, the reopen not acknowledged)
    stack.receiver()
    first = stack.worker(lanes=4)
    stack.wait_all_owned()
    people = range(5)
    send_in_order(stack, [seq for n in people for seq in (form_events(n), crm_events(n))], 4)
    store = stack.open_store()
    merged = {n: _merged(stack, store, n) for n in people}
    first.stop()
    kill = {"point": point, "action": "kill", "match": "person:", "times": 1}
    doomed = stack.worker(lanes=4, faults=[kill])
    stack.wait_all_owned()
    # When each merge is undone (queued, not waited for: the worker that takes over starts
    # once the doomed one is gone)
    absorbed = {}
    for n in people:
        email, phone = person(n)
        absorbed[n] = ({f"person:{email}", f"person:{phone}"} - {merged[n].key}).pop()
        done = stack.keylane("merges", "undo", absorbed[n], "--wait", "0")
        assert done.returncode == 0, done.stdout + done.stderr
    _wait(stack, lambda: not doomed.alive(), f"the kill at {point}")
    stack.worker(lanes=4)
    # Then every undo completed once: each record live again, kept apart, and its survivor
    # without what its release gave back
    for n in people:
        _wait(stack, lambda n=n: _release(store, absorbed[n]) is not None, f"release {n}")
        assert store.read(absorbed[n]).merged_into is None
        assert store.kept_apart(absorbed[n], merged[n].key)
        _check_released(store, absorbed[n], merged[n].key)
    steps = [e for e in store.journal_entries() if e.source == "keylane.merge"]
    for step in ("reopen-", "release-"):
        assert len([e for e in steps if e.event_id.startswith(step)]) == len(people), steps
    assert store.dead_letters(DeadLetterFilter()) == []


def _release(store: JournalStore, absorbed: str) -> JournalEntry | None:
    """The journal entry of the release of ``absorbed`` (a merge undone), if any."""
    found = [
        e
        for e in store.journal_entries()
        if e.event_id.startswith("release-") and (e.result or {}).get("released") == absorbed
    ]
    return found[0] if found else None


def _check_released(store: SqlStore, absorbed: str, survivor: str) -> None:
    """The survivor gave each field its absorb took back to what it held before (here:
    none, its events never set the CRM's fields), and kept the others (changed since: a
    sender's later event, forwarded to it)."""
    release = _release(store, absorbed)
    assert release is not None
    assert release.result is not None
    (absorb,) = [e for e in store.journal_entries(survivor) if e.event_id.startswith("absorb-")]
    assert absorb.result is not None
    taken, done = absorb.result["fields"], release.result
    assert absorb.result["replaced"] == done["restored"] == done["unknown"] == {}
    assert set(done["removed"]) | set(done["kept"]) == set(taken)
    fields = store.read(survivor).fields
    assert not set(done["removed"]) & fields.keys(), (done, fields)
    for name in done["kept"]:
        assert fields.get(name) != taken[name] or done["kept"][name]["by"], (name, done)


# -- kill -9 at each step of a merge, events streaming to both keys -----------------------


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    "point", ["worker.after_send", "merge.closed", "merge.absorbing", "merge.absorbed"]
)
def test_a_worker_killed_at_each_step_of_a_merge_loses_and_doubles_nothing(
    stack: Stack, point: str
) -> None:
    # Given a worker that dies (kill -9) at this step of the first merge it runs
    # When 20 people are announced by both senders, every sender in its own order, all at
    # once, and a worker takes over once the doomed one is gone
    people = range(20)
    kill_during_merges(stack, point, people)
    # Then each person is one record with every event applied once, in order per sender
    store = stack.open_store()
    _wait(stack, lambda: all(streamed_in(store, n) for n in people), "20 merged records")
    _wait(stack, lambda: store.journal_size() >= 180 + 40, "every event and merge step")
    for n in people:
        record = one_record(store, n)
        assert record is not None
        assert record.fields == {"form_seq": [1, 2, 3, 4], "crm_seq": [1, 2, 3, 4, 5]}, record
    # And no event was applied to a closed record: a tombstone is as its close left it
    steps = [e for e in store.journal_entries() if e.source == "keylane.merge"]
    closes = {e.record_key: e for e in steps if e.result and "merged_into" in e.result}
    assert len(closes) == 20
    for key, close in closes.items():
        assert store.read(key).revision == close.revision
    assert len([e for e in steps if e.event_id.startswith("absorb-")]) == 20
    assert store.dead_letters(DeadLetterFilter()) == []


# -- a reconcile: 10,000 records, 500 of them duplicates ----------------------------------


def _write_records(store: RecordStore, records: list[tuple[str, dict[str, Any]]]) -> None:
    """Records written as the lanes would (a journal entry each), a thousand per commit."""
    from keylane.workers.store_rows import Commit

    for start in range(0, len(records), 1000):
        chunk = records[start : start + 1000]
        commits = [
            Commit((event_write(lane_event(f"seed-{key}", key), fields, 0, 1),), None)
            for key, fields in chunk
        ]
        assert all(isinstance(r, int) for r in store.commit_group(commits))


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_reconcile_by_email_finds_every_duplicate_merges_the_safe_and_reviews_the_rest(
    stack: Stack,
) -> None:
    # Given 9,500 people, then 500 more records that are some of them again under another
    # key, their email spelled in capitals; 50 of those say another company
    stack.worker(lanes=16)
    stack.wait_all_owned()
    store = stack.open_store()
    people = [
        (f"person:{n:05d}", {"email": f"p{n}@example.com", "company": f"Co {n % 13}"})
        for n in range(9500)
    ]
    _write_records(store, people)
    dups = [
        (f"import:{n:05d}", {"email": f"P{n}@Example.com", "company": f"Co {n % 13}",
                             "source_row": n})
        for n in range(0, 9500, 19)
    ]  # fmt: skip
    for _key, fields in dups[:50]:
        fields["company"] = "Other Inc"
    _write_records(store, dups)
    assert len(dups) == 500
    # When a reconcile groups every record by its normalised email and waits for the lanes
    found = _reconcile(stack, "--by", "email", "--wait", "240")
    # Then it finds all 500 pairs, merges the 450 safe ones and reviews the 50 others
    # (its cost beside the baseline of the same store read page by page and nothing more)
    started = time.perf_counter()
    read_only = sum(1 for _ in live_records(store, ""))
    baseline_s = time.perf_counter() - started
    print(
        f"\nreconcile: {found['scanned']:,} records in {found['seconds']:.2f} s "
        f"({found['records_per_s']:,}/s, {found['proposed']} merges proposed); "
        f"the same {read_only:,} records read alone: {baseline_s:.2f} s "
        f"({read_only / baseline_s:,.0f}/s); ratio {found['seconds'] / baseline_s:.1f}x"
    )
    assert (found["scanned"], found["groups"], found["proposed"]) == (10_000, 500, 500)
    assert found["outcomes"] == {"merged": 450, "reviewed": 50, "not_merged": 0, "pending": 0}
    live = [r for r in store.scan_records(limit=20_000) if r.merged_into is None]
    assert len(live) == 9_550
    survivor = store.read("person:01140")  # the older record survives, with both rows' fields
    assert survivor.fields == {**people[1140][1], "source_row": 1140}
    assert len(store.dead_letters(DeadLetterFilter(reasons=("merge_review",)))) == 50
    # And run again, it proposes nothing: merged pairs are one, reviewed ones were decided
    again = _reconcile(stack, "--by", "email")
    assert (again["proposed"], again["decided_before"]) == (0, 50)


def _reconcile(stack: Stack, *args: str) -> dict[str, Any]:
    import subprocess
    import sys

    from tests.support.stack import settings_env

    done = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "merges", "reconcile", *args, "--json"],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


# -- chains and races ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_chain_of_merges_ends_in_the_oldest_record_with_every_event_in_order(
    stack: Stack,
) -> None:
    # Given three records created one after the other: c (oldest), b, then a
    stack.receiver()
    stack.worker(lanes=8)
    stack.wait_all_owned()
    store = stack.open_store()
    for key in ("c", "b", "a"):
        first = {"id": f"{key}-0", "record_key": f"chain:{key}", "also": [f"crm_id:{key}"],
                 "changes": {key: {"set": True}}}  # fmt: skip
        assert stack.post({"type": "test", **first}).status_code == 202
        _wait(stack, lambda k=key: store.read(f"chain:{k}").exists, f"chain:{key}")  # type: ignore[misc]
    # When a's events stream while a is linked to b and b to c, both links at once
    stream = [
        {"id": f"a-{i}", "record_key": "chain:a", "changes": {"seq": {"append": i}}}
        for i in range(1, 31)
    ]
    links = [
        [{"id": "link-ab", "record_key": "chain:a", "also": ["crm_id:a", "crm_id:b"],
          "changes": {"linked_ab": {"set": True}}}],
        [{"id": "link-bc", "record_key": "chain:b", "also": ["crm_id:b", "crm_id:c"],
          "changes": {"linked_bc": {"set": True}}}],
    ]  # fmt: skip
    send_in_order(stack, [stream, *links], senders=3)
    # Then all three are c, which holds every field and a's events once, in order
    _wait(stack, lambda: {live_end(store, f"chain:{k}").key for k in "abc"} == {"chain:c"}, "c")
    _wait(stack, lambda: store.journal("demo", "a-30") is not None, "a's last event")
    _wait(stack, lambda: len(store.read("chain:c").fields.get("seq", [])) >= 30, "every seq")
    fields = store.read("chain:c").fields
    assert fields.pop("seq") == list(range(1, 31))  # a's events: each once, in its order
    assert fields == {"a": True, "b": True, "c": True, "linked_ab": True, "linked_bc": True}
    assert store.dead_letters(DeadLetterFilter()) == []


# -- field ownership decides -----------------------------------------------------------

OWNING_SOURCES = """
[sources.form]
format = "keylane"

[sources.crm]
format = "keylane"
owns = ["phone", "company", "crm_seq", "email"]
"""


@pytest.mark.slow
def test_the_source_that_owns_a_field_by_name_wins_a_merge_where_it_differs(
    stack: Stack, tmp_path: Any
) -> None:
    # Given a form that may write any field and a CRM that owns company by name
    stack.use_sources(OWNING_SOURCES)
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    # When the form says Acme and the CRM Globex about one person, and the CRM links them
    form = form_events(3)
    form[0]["changes"]["company"] = {"set": "Acme"}
    crm = crm_events(3, company="Globex")

    def post_all(events: list[dict[str, Any]], source: str) -> None:
        for body in events:
            assert stack.post({"type": "test", **body}, source=source).status_code == 202

    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(post_all, form, "form"), pool.submit(post_all, crm, "crm")]:
            done.result()
    # Then the merge needs no person: the CRM's value is the one kept
    store = stack.open_store()
    record = _merged(stack, store, 3)
    assert record.fields["company"] == "Globex"
    assert store.dead_letters(DeadLetterFilter()) == []
    (close,) = [e for e in store.journal_entries() if e.event_id.startswith("close-")]
    assert close.result is not None
    assert set(close.result["take"].values()) <= {"absorbed", "survivor"}


# -- records elsewhere: a task's keys --------------------------------------------------


@pytest.mark.slow
def test_a_tasks_two_keys_of_one_person_are_merged_by_its_on_merge_and_their_lanes_made_one(
    stack: Stack, tmp_path: Any
) -> None:
    # Given a task whose records are in a CRM, with an on_merge that merges two contacts
    # there, fed by a form (by email) and a CRM (by phone, linking the email once)
    crm_db = task_deployment(stack, tmp_path)
    for _ in range(stack.writers(2)):
        stack.worker(lanes=8)
    stack.wait_all_owned()
    # When each sender posts its events in order, every sender at once
    people = range(20)
    post_to_the_task(stack, people)
    # Then the CRM holds one contact per person (the older key), with every number of
    # both senders once and in each sender's order; keylane's lanes of both keys end in
    # it, the absorbed key's row says where it went, on_merge ran once per person, in the
    # survivor's lane, and every event ran once
    check_task_merges(stack, crm_db, people)
    # And such a merge (made by on_merge, in the CRM) is not undone by keylane
    store = stack.open_store()
    email, phone = person(0)
    survivor = live_end(store, f"person:{email}").key
    absorbed = ({f"person:{email}", f"person:{phone}"} - {survivor}).pop()
    refused = stack.keylane("merges", "undo", absorbed)
    assert refused.returncode != 0
    assert "on_merge" in refused.stdout + refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("point", ["merge.closed", "merge.called", "destination.after_call"])
def test_a_worker_killed_at_each_step_of_a_tasks_merge_loses_and_doubles_nothing(
    stack: Stack, tmp_path: Any, point: str
) -> None:
    # Given the CRM task of the test above, and a worker that dies (kill -9) at this step
    # of the first merge it runs (merge.called: the task's on_merge ran, keylane's journal
    # does not know it yet), or after its first call of the task
    crm_db = task_deployment(stack, tmp_path)
    kill = {"point": point, "action": "kill", "match": "person:", "times": 1}
    doomed = stack.worker(lanes=8, faults=[kill])
    stack.wait_all_owned()
    people = range(10)
    # When both senders post, and a worker takes over once the doomed one is gone
    with ThreadPoolExecutor(1) as background:
        sending = background.submit(post_to_the_task, stack, people)
        wait_until(lambda: not doomed.alive(), 90, f"the kill at {point}", on_timeout=stack.logs)
        stack.worker(lanes=8)
        sending.result()
    # Then each person is one contact in the CRM and one lane in keylane, with every
    # event's effect once, in each sender's order, and one merge
    check_task_merges(stack, crm_db, people)


@pytest.mark.slow
def test_an_identity_of_a_tasks_key_and_of_keylanes_record_merges_nothing(
    stack: Stack, tmp_path: Any
) -> None:
    # Given the CRM task's sources, and a source of keylane's own records beside them
    crm_db = task_deployment(stack, tmp_path)
    sources = stack.settings.sources_file
    assert sources is not None
    sources.write_text(TASK_SOURCES + '\n[sources.members]\nformat = "keylane"\n')
    stack.procs[-1].stop()
    stack.receiver()
    stack.worker(lanes=4)
    stack.wait_all_owned()
    # When a member record of keylane's and a task's person both name one email
    email, _ = person(0)
    member = {"id": "m-1", "type": "test", "record_key": "member:1", "also": [f"email:{email}"],
              "changes": {"plan": {"set": "pro"}}}  # fmt: skip
    assert stack.post(member, source="members").status_code == 202
    ((source, form),) = told_to_the_task(0)[:1]
    for body in form:
        assert stack.post(body, source=source).status_code == 202
    stack.wait_journal(1 + len(form))
    # Then nothing is merged: each stays its own, the identity with the first that held it
    store = stack.open_store()
    assert store.read("member:1").merged_into is None
    task_key = store.read(f"person:{email}")
    assert (task_key.merged_into, task_key.kept_for) == (None, "task:sync_person")
    assert store.read("member:1").kept_for is None
    assert not [e for e in store.journal_entries() if e.source == "keylane.merge"]
    assert crm_contacts(crm_db)[f"person:{email}"]["form_seq"] == [1, 2, 3, 4]


def test_a_task_without_on_merge_takes_no_identities() -> None:
    # Given a task registered without on_merge
    import keylane
    from keylane.routing.contract.errors import InvalidEvent

    @keylane.task(key="plain:{id}", name="plain_no_merge")
    def plain(event: keylane.Event, ctx: keylane.Context) -> None:
        return None

    # When it is sent identities, Then it says what it needs
    with pytest.raises(InvalidEvent, match="on_merge"):
        plain.event_fields({"id": 1}, None, "event", ["email:a@b.co"])
    # And one registered with on_merge takes them, in their normal form
    merging = keylane.task(key="m:{id}", name="merging_task", on_merge=lambda e, c: None)(
        lambda e, c: None
    )
    fields = merging.event_fields({"id": 1}, None, "event", ["email: A@B.co", "phone:"])
    assert fields["identities"] == ("email:a@b.co",)


def test_also_goes_to_a_task_with_on_merge_and_never_to_a_forward() -> None:
    import keylane
    from keylane.routing.contract.errors import ConfigError
    from keylane.routing.contract.sources import parse_sources
    from keylane.workers.destinations import open_destinations

    @keylane.task(key="lead:{id}", name="lead_without_merge")
    def leads(event: keylane.Event, ctx: keylane.Context) -> None:
        return None

    # Given a source that names identities for a task that has no on_merge
    sources = parse_sources(
        '[sources.leads]\ntask = "lead_without_merge"\nrecord_key = "lead:{body:id}"\n'
        'also = ["email:{body:email}"]\n'
    )
    # When a worker opens its destinations, Then it refuses to start, saying what to add
    with pytest.raises(ConfigError, match="on_merge"):
        open_destinations(sources)
    # And a forward (whose records keylane cannot merge) is refused identities
    with pytest.raises(ConfigError, match="not to a destination"):
        parse_sources(
            '[destinations.hook]\nurl = "http://127.0.0.1:9/x"\n'
            '[sources.shop]\ndestination = "hook"\nrecord_key = "o:{body:id}"\n'
            'also = ["email:{body:email}"]\n'
        )
