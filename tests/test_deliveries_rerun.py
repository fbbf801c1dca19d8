"""``keylane deliveries rerun`` through real processes: deliveries a wrong mapping refused
at the door, run again after the mapping is fixed, apply exactly what the command says,
once; run again once more they are duplicates; ``--new-ids`` applies them anew; a
delivery kept without its body cannot be run again (ops/docs/deliveries.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.stack import Stack, wait_until

SECRET = "crm-secret-123"
SOURCES = """
[sources.crm]
verify = {{ scheme = "hmac", secrets_env = ["CRM_SECRET"], header = "X-Checksum" }}
format = "mapped"
event_id = "body:id"
event_type = "body:type"
record_key = "contact:{{body:contact.{key_field}}}"

[sources.crm.on."contact.visited"]
visits = {{ increment = "body:n" }}
"""
WRONG = SOURCES.format(key_field="idx")  # the sender's field is contact.id
FIXED = SOURCES.format(key_field="id")


def _body(event_id: str, contact: int, n: int, kind: str = "contact.visited") -> bytes:
    return json.dumps({"id": event_id, "type": kind, "contact": {"id": contact}, "n": n}).encode()


def _post(stack: Stack, body: bytes, signed: bool = True) -> httpx.Response:
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"content-type": "application/json", "x-checksum": digest if signed else "0" * 64}
    return httpx.post(f"{stack.url}/webhooks/crm", content=body, headers=headers, timeout=30)


def _rerun(stack: Stack, *args: str, code: int = 0) -> dict[str, Any]:
    done = stack.keylane("deliveries", "rerun", *args, "--json")
    assert done.returncode == code, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _events(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (e["event_id"], e["record_key"], e["result"])
        for d in report["deliveries"]
        for e in d["events"]
    ]


def _kept(stack: Stack, count: int) -> list[dict[str, Any]]:
    def listed() -> list[dict[str, Any]]:
        done = stack.keylane("deliveries", "list", "--source", "crm", "--json")
        found: list[dict[str, Any]] = json.loads(done.stdout)["deliveries"]
        return found

    wait_until(lambda: len(listed()) >= count, 30, f"{count} kept", stack.logs)
    return listed()


def _visits(stack: Stack, key: str) -> Any:
    return stack.open_store().read(key).fields.get("visits")


@pytest.mark.slow
def test_deliveries_a_wrong_mapping_refused_are_applied_once_after_the_fix(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a source whose record key reads a field its sender does not send
    stack.use_sources(WRONG)
    stack.extra_env["CRM_SECRET"] = SECRET
    receiver = stack.receiver()
    # When three signed deliveries come (two for contact 1, one for contact 2)
    bodies = [_body("evt-1", 1, 1), _body("evt-2", 2, 2), _body("evt-3", 1, 5)]
    assert [_post(stack, b).status_code for b in bodies] == [400, 400, 400]
    # and one forged one
    assert _post(stack, _body("evt-4", 2, 100), signed=False).status_code == 401
    kept = _kept(stack, 4)
    assert sorted(e["status_name"] for e in kept) == ["invalid"] * 3 + ["unverified"]
    # Then the mapping is fixed, and a worker applies what comes
    receiver.stop()
    stack.use_sources(FIXED)
    stack.worker()
    stack.receiver()
    stack.wait_journal(0)

    # A dry run maps each as the fixed mapping does, and queues nothing
    dry = _rerun(stack, "--status", "invalid", "--dry-run")
    assert dry["dry_run"] is True
    assert [d["verdict"] for d in dry["deliveries"]] == ["mapped"] * 3
    assert _events(dry) == [
        ("evt-1", "contact:1", "new"),
        ("evt-2", "contact:2", "new"),
        ("evt-3", "contact:1", "new"),
    ]  # oldest first: as their sender sent them
    assert dry["deliveries"][0]["events"][0]["changes"] == {
        "visits": {"op": "increment", "value": 1}
    }
    assert stack.open_store().journal_size() == 0

    # The run applies each once, in the order they came
    ran = _rerun(stack, "--status", "invalid")
    assert [d["verdict"] for d in ran["deliveries"]] == ["ran"] * 3
    assert [r for _, _, r in _events(ran)] == ["new"] * 3
    stack.wait_journal(3)
    wait_until(lambda: _visits(stack, "contact:1") == 6, 60, "contact:1 applied", stack.logs)
    assert _visits(stack, "contact:2") == 2

    # Run again, each is a duplicate: nothing more applied
    again = _rerun(stack, "--status", "invalid")
    assert [r for _, _, r in _events(again)] == ["duplicate"] * 3
    # and the sender's own retry, now mapped, is a duplicate too
    retry = _post(stack, bodies[0])
    assert retry.status_code == 200
    assert retry.headers["keylane-replayed"] == "true"
    dry_again = _rerun(stack, "--source", "crm", "--status", "invalid", "--dry-run")
    assert [r for _, _, r in _events(dry_again)] == ["duplicate"] * 3

    # With --new-ids, one delivery is applied again, under a new id that says so
    first = next(e["id"] for e in reversed(kept) if e["status_name"] == "invalid")
    anew = _rerun(stack, first, "--new-ids")
    ((event_id, key, result),) = _events(anew)
    assert event_id.startswith("evt-1:rerun-")
    assert (key, result) == ("contact:1", "new")
    wait_until(lambda: _visits(stack, "contact:1") == 7, 60, "the new id applied", stack.logs)
    store = stack.open_store()
    assert store.journal_size() == 4  # evt-1, evt-2, evt-3 and evt-1's new id: once each
    assert _visits(stack, "contact:2") == 2

    # The forged one cannot be run again: its body was never kept
    forged = next(e["id"] for e in kept if e["status_name"] == "unverified")
    refused = _rerun(stack, forged, code=1)
    (one,) = refused["deliveries"]
    assert one["verdict"] == "cannot"
    assert "unverified" in one["reason"]
    # And the text form says what each did
    text = stack.keylane("deliveries", "rerun", first)
    assert text.returncode == 0, text.stderr
    assert "duplicate: accepted before, not applied again" in text.stdout


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_delivery_still_refused_by_the_mapping_is_told_and_nothing_is_queued(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a delivery the wrong mapping refused
    stack.use_sources(WRONG)
    stack.extra_env["CRM_SECRET"] = SECRET
    stack.receiver()
    assert _post(stack, _body("evt-9", 9, 1)).status_code == 400
    (kept,) = _kept(stack, 1)
    # When it is run again with the mapping still wrong
    report = _rerun(stack, kept["id"], code=1)
    # Then it is refused as it was, with why, and nothing is queued
    (one,) = report["deliveries"]
    assert (one["verdict"], one["status"]) == ("refused", 400)
    assert "contact.idx" in one["reason"]
    view = stack.view()
    assert [view.depth(shard) for shard in range(stack.settings.shards.count)] == [0] * (
        stack.settings.shards.count
    )
    assert len(_kept(stack, 1)) == 1  # a rerun's refusal is told, not kept again


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_rerun_asks_for_ids_or_a_filter(stack: Stack) -> None:
    done = stack.keylane("deliveries", "rerun")
    assert done.returncode != 0
    assert "give delivery IDs, or a filter" in done.stderr


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("text", ["nope", "crm/abc"])
def test_a_rerun_of_what_is_not_a_delivery_id_says_so(stack: Stack, text: str) -> None:
    done = stack.keylane("deliveries", "rerun", text)
    assert done.returncode != 0
    assert "not a delivery id" in done.stderr
