"""Accepted deliveries kept (ops/docs/deliveries.md), through a real receiver and worker on
both stores: each event links back to its delivery in the journal; a source's window
(``keep_deliveries``) decides which deliveries its lanes keep in the store, once per
delivery with all its events; a delivery whose events were all ignored is kept in the
source's door stream; ``keylane deliveries`` lists both kinds and shows one whole; the
prune archives kept deliveries with the journal."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from keylane.ops.deliveries import DeliveryQuery, parse_delivery_id
from keylane.routing.contract.errors import ConfigError, KeylaneError
from keylane.routing.contract.kept_deliveries import MINTED_SEQ_MIN, new_delivery_id
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.sources import parse_sources
from tests.support.readme import page_text
from tests.support.stack import Stack, event, wait_until

SOURCES = """
[sources.every]                  # keeps every delivery
verify = { scheme = "none" }
keep_deliveries = "all"

[sources.errs]                   # the default window: errors only
verify = { scheme = "none" }

[sources.batch]                  # a batched sender (a JSON array), errors only
verify = { scheme = "none" }
items = "body:*"

[sources.quiet]                  # keeps nothing
verify = { scheme = "none" }
keep_deliveries = "off"
items = "body:*"

[sources.mapped]                 # maps one event type; every other is ignored
verify = { scheme = "none" }
format = "mapped"
record_key = "item:{body:sku}"
event_id = "body:id"
[sources.mapped.on."item.seen"]
seen = { increment = 1 }
"""


def _start(stack: Stack, **settings: Any) -> None:
    stack.use_sources(SOURCES, **settings)
    stack.worker()
    stack.receiver()
    stack.wait_all_owned()


def _post(stack: Stack, source: str, body: Any, query: str = "", **headers: str) -> int:
    data = json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **headers}
    url = f"{stack.url}/webhooks/{source}{query}"
    return httpx.post(url, content=data, headers=hdrs, timeout=30).status_code


def _listed(stack: Stack, *args: str) -> dict[str, Any]:
    done = stack.keylane("deliveries", "list", "--json", *args)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _ids(stack: Stack, *args: str) -> list[str]:
    return [e["id"] for e in _listed(stack, *args)["deliveries"]]


def _shown(stack: Stack, delivery_id: str) -> dict[str, Any]:
    done = stack.keylane("deliveries", "show", delivery_id, "--json", "--body")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def _journal(stack: Stack, source: str, event_id: str) -> dict[str, Any]:
    done = stack.keylane("journal", "find", event_id, "--source", source, "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    (row,) = json.loads(done.stdout)
    assert isinstance(row, dict)
    return row


def _kept_rows(stack: Stack) -> int:
    store = stack.open_store()
    store.migrate()
    return store.table_ages()["deliveries"].rows


@pytest.mark.slow
def test_an_accepted_delivery_is_kept_under_all_and_links_from_the_journal(
    stack: Stack,
) -> None:
    # Given a source that keeps every delivery, and one that keeps errors only
    _start(stack)
    body = event("evt-1", "contact:1", visits={"increment": 1})
    # When each gets a delivery that applies
    assert _post(stack, "every", body, "?page=2&token=abc", Authorization="Bearer sekrit") == 202
    assert _post(stack, "errs", event("evt-2", "contact:2", visits={"increment": 1})) == 202
    stack.wait_journal(2)
    # Then each event's journal row names the delivery it came from, shown by journal find
    every, errs = _journal(stack, "every", "evt-1"), _journal(stack, "errs", "evt-2")
    assert parse_delivery_id(every["delivery"])[0] == "every"
    assert parse_delivery_id(errs["delivery"])[0] == "errs"
    text = stack.keylane("journal", "find", "evt-1", "--source", "every").stdout
    assert every["delivery"] in text
    # And only the `all` source's delivery is kept: the applied one under `errors` is not
    assert _ids(stack, "--status", "accepted") == [every["delivery"]]
    with pytest.raises(AssertionError, match="no delivery"):
        _shown(stack, errs["delivery"])
    # And it is shown whole: the request as it came (secrets redacted), how it was
    # verified, the event it became and its outcome
    shown = _shown(stack, every["delivery"])
    sent = json.dumps(body).encode()
    assert (shown["status_name"], shown["verified_by"], shown["method"]) == (
        "accepted",
        "none",
        "POST",
    )
    assert shown["path"] == "/webhooks/every"
    assert shown["query"] == "page=2&token=%5Bredacted%5D"
    assert shown["headers"]["authorization"] == "[redacted]"
    assert "sekrit" not in json.dumps(shown)
    assert shown["body"] == sent.decode()
    assert (shown["size"], shown["sha256"]) == (len(sent), hashlib.sha256(sent).hexdigest())
    (ev,) = shown["events"]
    assert (ev["event_id"], ev["record_key"], ev["outcome"], ev["revision"]) == (
        "evt-1",
        "contact:1",
        "applied",
        1,
    )
    assert ev["dead_letters"] == []
    text = stack.keylane("deliveries", "show", every["delivery"]).stdout
    assert "202 accepted: 1 event(s), 1 applied" in text
    assert "verified: yes (none)" in text
    assert "evt-1" in text
    assert "applied" in text


@pytest.mark.slow
def test_a_batched_delivery_is_kept_once_with_its_events_when_one_is_dead_lettered(
    stack: Stack,
) -> None:
    # Given a batched source keeping errors only, and a record whose field holds text
    _start(stack)
    assert _post(stack, "errs", event("setup", "contact:9", plan={"set": "pro"})) == 202
    stack.wait_journal(1)
    # When one delivery carries three events, one of which cannot apply (an increment of
    # the text field: a `type` dead letter for that record only)
    items = [
        event("b-1", "contact:7", visits={"increment": 1}),
        event("b-2", "contact:9", plan={"increment": 1}),
        event("b-3", "contact:8", visits={"increment": 2}),
    ]
    assert _post(stack, "batch", items) == 202
    stack.wait_journal(4)
    # Then the delivery is kept once, with all three events and each one's outcome
    wait_until(lambda: _kept_rows(stack) == 1, 30, "the delivery kept", stack.logs)
    (listed,) = _listed(stack, "--source", "batch")["deliveries"]
    assert listed["outcomes"] == ["applied", "dead-lettered"]
    shown = _shown(stack, listed["id"])
    outcomes = {e["event_id"]: e["outcome"] for e in shown["events"]}
    assert outcomes == {"b-1": "applied", "b-2": "dead-lettered", "b-3": "applied"}
    (dead,) = next(e for e in shown["events"] if e["event_id"] == "b-2")["dead_letters"]
    assert (dead["reason"], dead["status"]) == ("type", "open")
    assert json.loads(shown["body"]) == items
    # And every event's journal row names that one delivery
    assert {_journal(stack, "batch", i)["delivery"] for i in ("b-1", "b-2", "b-3")} == {
        listed["id"]
    }
    # And the outcome filter finds it, the applied-only filter of an errors source too
    assert _ids(stack, "--outcome", "dead-lettered") == [listed["id"]]
    assert _ids(stack, "--outcome", "refused") == []
    text = stack.keylane("deliveries", "show", listed["id"]).stdout
    assert "dead-lettered" in text
    assert "type (open)" in text


@pytest.mark.slow
def test_a_refused_event_keeps_its_delivery_under_errors_and_off_keeps_nothing(
    stack: Stack,
) -> None:
    # Given the default window (errors) and a source whose window is off
    _start(stack)
    # When an event is refused (its if_revision does not hold) under errors, and under
    # off an event is dead-lettered and a delivery is refused at the door
    refused = {**event("r-1", "contact:3", visits={"increment": 1}), "if_revision": 5}
    assert _post(stack, "errs", refused) == 202
    assert _post(stack, "quiet", [event("q-1", "contact:4", plan={"set": "x"})]) == 202
    stack.wait_journal(2)
    assert _post(stack, "quiet", [event("q-2", "contact:4", plan={"increment": 1})]) == 202
    assert _post(stack, "quiet", {"not": "an event"}) == 400
    stack.wait_journal(3)
    # Then the refused event's delivery is kept, with its outcome
    wait_until(lambda: _kept_rows(stack) >= 1, 30, "the refused delivery kept", stack.logs)
    (listed,) = _listed(stack, "--status", "accepted")["deliveries"]
    assert (listed["source"], listed["outcomes"]) == ("errs", ["refused"])
    assert _ids(stack, "--outcome", "refused") == [listed["id"]]
    # And nothing of the source whose window is off: not in the store, not at the door
    assert _listed(stack, "--source", "quiet")["deliveries"] == []
    assert _journal(stack, "quiet", "q-2")["outcome"] == "dead_lettered"
    assert _kept_rows(stack) == 1
    # But its events still link back to their delivery
    assert parse_delivery_id(_journal(stack, "quiet", "q-2")["delivery"])[0] == "quiet"


@pytest.mark.slow
def test_a_delivery_whose_events_were_all_ignored_is_kept_at_the_door(stack: Stack) -> None:
    # Given a mapped source that maps item.seen only
    _start(stack)
    # When a delivery of another type comes (a mapping error), and one of the mapped type
    assert _post(stack, "mapped", {"id": "m-1", "type": "item.sold", "sku": "a"}) == 200
    assert _post(stack, "mapped", {"id": "m-2", "type": "item.seen", "sku": "a"}) == 202
    stack.wait_journal(1)
    # Then the ignored one is kept in the door stream, as ignored, with its body
    wait_until(lambda: len(_ids(stack, "--status", "ignored")) == 1, 30, "ignored kept", stack.logs)
    (listed,) = _listed(stack, "--outcome", "ignored")["deliveries"]
    assert (listed["status"], listed["status_name"], listed["code"]) == (200, "ignored", "ignored")
    assert "item.sold" in listed["detail"]
    shown = _shown(stack, listed["id"])
    assert json.loads(shown["body"])["type"] == "item.sold"
    # And the id was never marked seen: after the mapping is fixed, the sender's retry is
    # accepted (it would have been a duplicate otherwise)
    assert stack.view().client.exists(stack.settings.keys.dedupe("mapped", "m-1")) == 0


@pytest.mark.slow
def test_list_pages_across_both_kinds_newest_first_and_prune_archives(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source keeping all, whose journal rows (and kept deliveries) last 1 s
    sources = SOURCES.replace(
        'keep_deliveries = "all"\n', 'keep_deliveries = "all"\nretention_s = 1\n', 1
    )
    stack.use_sources(sources, journal_margin_s=0, archive_dir=tmp_path / "archive")
    stack.worker()
    stack.receiver()
    stack.wait_all_owned()
    # When accepted and refused deliveries alternate
    for n in range(3):
        assert _post(stack, "every", event(f"p-{n}", f"contact:{n}", v={"set": n})) == 202
        assert _post(stack, "every", {"refused": n}) == 400
    stack.wait_journal(3)
    wait_until(lambda: len(_ids(stack, "--since", "1h")) == 6, 30, "six kept", stack.logs)
    everything = _ids(stack)
    # Then paging by two walks them all, newest first, each once, kinds interleaved
    seen: list[str] = []
    before: list[str] = []
    while True:
        page = _listed(stack, "--limit", "2", *before)
        seen += [e["id"] for e in page["deliveries"]]
        if page["next_before"] is None:
            break
        before = ["--before", page["next_before"]]
    assert seen == everything
    assert len(seen) == 6
    kinds = [e["kind"] for e in _listed(stack)["deliveries"]]
    assert kinds == ["door", "accepted"] * 3
    # And a prune after the window archives the kept deliveries with the journal rows
    time.sleep(1.5)
    done = stack.keylane("journal", "prune", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tables"]["deliveries"]["archived"] == 3
    assert _kept_rows(stack) == 0
    assert _ids(stack, "--status", "accepted") == []
    files = list((tmp_path / "archive" / "deliveries").glob("*/*.jsonl.gz"))
    archived = [
        json.loads(line) for f in files for line in gzip.decompress(f.read_bytes()).splitlines()
    ]
    assert sorted(r["request"]["sha256"] for r in archived) == sorted(
        hashlib.sha256(
            json.dumps(event(f"p-{n}", f"contact:{n}", v={"set": n})).encode()
        ).hexdigest()
        for n in range(3)
    )


def test_a_delivery_id_is_one_format_checked_before_anything_is_asked() -> None:
    # Given a minted id and a door stream's id
    minted = new_delivery_id("crm", 1733580000.0)
    source, entry = parse_delivery_id(minted)
    assert source == "crm"
    assert entry.startswith("1733580000000-")
    assert int(entry.split("-")[1]) >= MINTED_SEQ_MIN
    assert parse_delivery_id("crm/1733580000000-0") == ("crm", "1733580000000-0")
    # Then a filter with anything else is refused before Redis or the store is asked
    for text in ("crm/garbage", "crm/1-2-3", "../x/1-0", "CRM/1-0"):
        with pytest.raises(KeylaneError, match="not a delivery id"):
            DeliveryQuery(before=text)
    with pytest.raises(KeylaneError, match="--outcome"):
        DeliveryQuery(outcomes=("lost",))


def test_a_source_s_window_is_its_own_else_the_settings_and_the_page_s_table_loads() -> None:
    # Given the Deliveries page's sources table, and a source that names no window
    blocks = page_text("deliveries.md").split("```toml\n")[1].split("```")[0]
    sources = parse_sources(blocks + '\n[sources.plain]\nverify = { scheme = "none" }\n')
    crm, plain = sources.get("crm"), sources.get("plain")
    assert crm is not None
    assert plain is not None
    # Then the page's source keeps all; the other keeps what the settings say
    assert crm.delivery_window(Settings()) == "all"
    assert plain.delivery_window(Settings()) == "errors"
    assert plain.delivery_window(Settings(keep_deliveries="off")) == "off"
    # And a window that is none of the three is refused when the file is read
    with pytest.raises(ConfigError, match="keep_deliveries"):
        parse_sources('[sources.x]\nverify = { scheme = "none" }\nkeep_deliveries = "some"\n')
