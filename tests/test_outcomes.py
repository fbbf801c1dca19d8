"""Told outcomes (issue 35, part B): ``Prefer: wait``, ``GET /outcomes/...``, a replay of
a decided event, and what a crash or a restart leaves a waiting sender
(``ops/docs/outcomes.md``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import redis

from keylane.routing.contract.outcomes import (
    Told,
    decode_told,
    encode_told,
    http_status_of,
    outcome_path,
    preferred_wait_s,
    told_names,
)
from keylane.routing.contract.settings import FaultSpec
from tests.support.marks import remembered
from tests.support.readme import page_block, page_block_containing, pasted, reader_env
from tests.support.services import free_port
from tests.support.stack import Stack, event, wait_until
from tests.support.waiting import restart_under_500_waiting

TOKEN = "s3cret-outcomes-token"


# -- the contract ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("wait=10", 10),
        ("WAIT = 5", 5),
        ('wait="7"', 7),
        ("respond-async, wait=3", 3),
        ("wait=4; foo=bar", 4),
        ("wait=", None),
        ("wait=abc", None),
        ("wait=-1", None),
        ("wait=1.5", None),
        ("return=minimal", None),
        ("", None),
        (None, None),
    ],
)
def test_prefer_wait_is_read_as_rfc_7240_says_and_a_malformed_one_is_ignored(
    header: str | None, seconds: int | None
) -> None:
    # Given a Prefer header, Then its wait is read, or ignored when malformed
    assert preferred_wait_s(header) == seconds


def test_a_told_outcome_round_trips_and_carries_its_status() -> None:
    # Given a told outcome of each status
    for status, code in (("applied", 200), ("refused", 409), ("dead_lettered", 422)):
        told = Told(
            status=status,  # type: ignore[arg-type]
            source="demo",
            event_id="e/1",
            record_key="k",
            revision=3,
            decided_at=1.0,
        )
        body = encode_told(told)
        # Then its body reads back as it was, with its HTTP status and its names
        assert decode_told(body) == told
        assert told.http_status == http_status_of(body) == code
        assert told_names(body) == ("demo", "e/1")
    # And a location names the event, percent-encoded
    assert outcome_path("demo", "e/1 x") == "/outcomes/demo/e%2F1%20x"


# -- real processes ----------------------------------------------------------------------


def _get(stack: Stack, event_id: str, token: str | None = TOKEN, **headers: str) -> httpx.Response:
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.get(f"{stack.url}/outcomes/demo/{event_id}", headers=headers, timeout=30)


@pytest.mark.slow
def test_a_sender_that_waits_is_told_and_a_replay_and_a_get_tell_the_same(stack: Stack) -> None:
    # Given a deployment whose outcomes are open to a token
    stack.worker(lanes=2)
    stack.receiver(outcomes_token=TOKEN)
    stack.wait_all_owned()
    # When a sender posts with Prefer: wait
    first = stack.post(event("w-1", "told:1", n={"increment": 5}), prefer="wait=10")
    # Then it is told the outcome: applied, at revision 1, within the wait
    assert first.status_code == 200, first.text
    assert first.headers["preference-applied"] == "wait=10"
    told = first.json()
    assert (told["status"], told["revision"], told["record_key"]) == ("applied", 1, "told:1")
    # And a replay of the same delivery gets the same outcome, marked replayed
    again = stack.post(event("w-1", "told:1", n={"increment": 5}))
    assert again.status_code == 200
    assert again.headers["keylane-replayed"] == "true"
    assert again.json() == told
    # And GET /outcomes tells it too, with the token only
    assert _get(stack, "w-1").json() == told
    assert _get(stack, "w-1", token="wrong").status_code == 401
    assert _get(stack, "w-1", token=None).status_code == 401
    assert _get(stack, "nope").status_code == 404
    # And a malformed wait is ignored: the plain 202, no Preference-Applied
    plain = stack.post(event("w-2", "told:2", n={"increment": 1}), prefer="wait=soon")
    assert plain.status_code == 202
    assert "preference-applied" not in plain.headers
    # And a dead letter is told 422, with its row
    bad = stack.post(event("w-3", "told:1", n={"append": 1}), prefer="wait=10")
    assert bad.status_code == 422, bad.text
    assert bad.json()["status"] == "dead_lettered"
    assert bad.json()["dead_letter_id"] >= 1
    # And the record was changed once
    assert stack.open_store().read("told:1").fields == {"n": 5}


@pytest.mark.slow
def test_a_replay_after_its_outcome_is_no_longer_kept_is_told_it_by_its_lane(
    stack: Stack,
) -> None:
    # Given a deployment that keeps a told outcome one second (the dedupe window: 3 days)
    stack.extra_env["KEYLANE_OUTCOME_KEEP_S"] = "1"
    stack.worker(lanes=2)
    stack.receiver(outcomes_token=TOKEN)
    stack.wait_all_owned()
    booked = event("keep-1", "keep:1", n={"increment": 5})
    refused = {**event("keep-2", "keep:1", n={"increment": 1}), "conditions": {"n": {"eq": 0}}}
    first = stack.post(booked, prefer="wait=10").json()
    no = stack.post(refused, prefer="wait=10").json()
    assert (first["status"], no["status"]) == ("applied", "refused")
    # When Redis no longer keeps their outcomes (their ids are still remembered)
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    keys = stack.settings.keys
    wait_until(
        lambda: not client.exists(keys.outcome("demo", "keep-1"), keys.outcome("demo", "keep-2")),
        10,
        "the told outcomes to expire",
    )
    assert remembered(client, keys, "demo", "keep-1")
    # Then a replay, waiting or not, is told each stored outcome by its lane, replayed
    for prefer in ({}, {"prefer": "wait=10"}):
        again = stack.post(booked, **prefer)
        assert again.status_code == 200, again.text
        assert again.headers["keylane-replayed"] == "true"
        assert {k: again.json()[k] for k in ("status", "revision", "result")} == {
            k: first[k] for k in ("status", "revision", "result")
        }
        client.delete(keys.outcome("demo", "keep-1"))
    late_no = stack.post(refused)
    assert late_no.status_code == 409, late_no.text
    assert (late_no.json()["status"], late_no.json()["reason"]) == ("refused", no["reason"])
    # And GET /outcomes tells it while it is kept again
    assert _get(stack, "keep-2").json()["status"] == "refused"
    # And nothing was applied twice: the lane found each replay in the journal
    assert stack.open_store().read("keep:1").fields == {"n": 5}
    assert stack.settled_counters()["duplicate"] == 3
    client.close()


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_outcomes_are_closed_without_a_token(stack: Stack) -> None:
    # Given a receiver with no outcomes token
    stack.receiver()
    # When anyone asks for an outcome, Then it is refused, saying how to open it
    answer = _get(stack, "x", token="anything")
    assert answer.status_code == 403
    assert "KEYLANE_OUTCOMES_TOKEN" in answer.json()["detail"]


@pytest.mark.slow
def test_a_worker_killed_between_the_write_and_the_tell_leaves_a_202_then_the_retry_is_told(
    stack: Stack,
) -> None:
    # Given a worker that dies (kill -9) after the store committed, before it acknowledges
    kill = FaultSpec(point="worker.before_ack", action="kill", match="crash:")
    doomed = stack.worker(lanes=2, faults=[kill.model_dump()])
    stack.receiver()
    stack.wait_all_owned()
    delivery = event("k-1", "crash:1", n={"increment": 7})
    # When a sender waits for the outcome of an event whose worker dies at that point
    first = stack.post(delivery, prefer="wait=3")
    # Then it is told the true outcome or "not known in time" (202), never another
    assert first.status_code in (200, 202), first.text
    if first.status_code == 200:
        assert first.json()["status"] == "applied"
    else:
        assert first.headers["location"] == "/outcomes/demo/k-1"
    wait_until(lambda: not doomed.alive(), 30, "the worker to die")
    # And once a worker takes the shard over, the retry of the same delivery is told the
    # stored outcome (the redelivery found it journaled and told it again)
    stack.worker(lanes=2)
    retry = stack.post(delivery, prefer="wait=30")
    assert retry.status_code == 200, retry.text
    assert retry.headers["keylane-replayed"] == "true"
    assert (retry.json()["status"], retry.json()["revision"]) == ("applied", 1)
    # And the event was applied once
    assert stack.open_store().read("crash:1").fields == {"n": 7}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_receiver_restarted_while_500_requests_wait_answers_none_wrongly(stack: Stack) -> None:
    restart_under_500_waiting(stack)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_curl_example_of_the_outcomes_page_runs_as_written(stack: Stack) -> None:
    # Given a deployment, and the page's curl example
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    script = page_block("outcomes.md", "curl -s -i -X POST")
    # When it is run as written (the receiver's address in RECEIVER)
    env = {**os.environ, "RECEIVER": stack.url}
    run = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    # Then it is told the outcome: applied, at revision 1
    head, _, body = run.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 200"), run.stdout + run.stderr
    assert "preference-applied: wait=10" in head.lower()
    told = json.loads(body)
    assert (told["status"], told["revision"], told["event_id"]) == ("applied", 1, "evt_wait_1")


@pytest.mark.slow
def test_the_token_step_of_the_outcomes_page_runs_after_the_wait_example(tmp_path: Path) -> None:
    # Given a shell with keylane on PATH, in a folder of its own, no keylane configuration
    port = free_port()
    env = reader_env(port)
    # When a reader follows the page: the stack started as Getting started starts it, the
    # waiting example, then the token step as written (which stops that stack first)
    started = page_block_containing("getting-started.md", "\nkeylane up &")
    start = [line for line in started.splitlines() if line.startswith("keylane up ")]
    waiting = page_block("outcomes.md", "curl -s -i -X POST")
    token_step = page_block("outcomes.md", "kill %1 && wait %1")
    followed = "\n".join([*start, waiting, token_step]).replace(
        "127.0.0.1:8000", f"127.0.0.1:{port}"
    )
    with pasted(followed, tmp_path, env, tmp_path) as out:
        printed = out.read_text().splitlines()
    # Then the outcome asked with the token is the one told before the restart, as shown
    shown = token_step.splitlines()[-1].removeprefix("# ").removesuffix(",...}")
    asked = printed[-1]
    assert asked.startswith(shown), (asked, shown)
    assert json.loads(asked)["status"] == "applied"
    # And the second stack started: nothing refused as already running
    assert "already running" not in (tmp_path / "stderr").read_text()
