"""Told outcomes for the other askers (issue 35): a Python sender that waits
(``Sender.send(wait=...)``, ``keylane.change``, ``task.send(wait=...)``), ``keylane
outcome`` on the command line, per-source outcome tokens, and 1,000 requests waiting at
once on one receiver (``ops/docs/outcomes.md``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from pydantic import SecretStr

from keylane.producers.gateway import ReceiverGateway
from keylane.producers.outcome_reads import OutcomeReads, source_tokens
from keylane.producers.outcome_waits import OutcomeWaits
from keylane.producers.sender import Sender
from keylane.routing.contract.errors import ConfigError, InvalidEvent
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.sources import parse_sources
from tests.support.marks import forget
from tests.support.readme import page_block
from tests.support.stack import Stack, event, settings_env, wait_until

GLOBAL_TOKEN = "global-outcomes-token"
BOOKINGS_TOKEN = "bookings-own-token"
SOURCES = """
[sources.bookings]
outcomes_token_env = "BOOKINGS_OUTCOMES_TOKEN"

[sources.shop]
"""


@pytest.fixture
def sender(stack: Stack) -> Iterator[Sender]:
    """A Python sender on the test's deployment, closed afterwards."""
    sent = Sender(stack.settings)
    yield sent
    sent.close()


def _slot(who: str) -> dict[str, object]:
    return {
        "source": "demo",
        "destination": None,
        "payload": None,
        "record_key": "slot:1",
        "event_id": f"book-1-{who}",
        "changes": {"owner": {"set": who}},
        "conditions": {"owner": {"absent": True}},
    }


def _outcome(stack: Stack, *args: str) -> tuple[int, dict[str, object]]:
    run = stack.keylane("outcome", *args, "--json")
    assert run.returncode in (0, 1, 3), run.stdout + run.stderr
    return run.returncode, json.loads(run.stdout)


# -- without services ----------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_conditions_sent_from_python_are_checked_by_the_receivers_rules(settings: Settings) -> None:
    # Given a Python sender
    sender = Sender(settings)
    try:
        # When a change carries a malformed condition, Then it is refused, naming it
        with pytest.raises(InvalidEvent, match="unknown condition operator 'over'"):
            sender.new_event(**{**_slot("ada"), "conditions": {"owner": {"over": 1}}})
        with pytest.raises(InvalidEvent, match="if_revision"):
            sender.new_event(**{**_slot("ada"), "if_revision": -1})
        # And conditions on a task's event are refused (a task checks its own record)
        with pytest.raises(InvalidEvent, match=r"keylane\.Refuse"):
            sender.new_event("t", "task:t", {"a": 1}, "k", conditions={"a": {"present": True}})
        # And a negative wait is refused before anything is sent
        with pytest.raises(InvalidEvent, match="wait"):
            sender.wait_s(-1)
        # And the same id with other conditions is another body (a reused id, not a duplicate)
        plain, conditioned = (
            sender.new_event(**_slot("ada")),
            sender.new_event(**{**_slot("ada"), "if_revision": 0}),
        )
        assert plain.body_sha256 != conditioned.body_sha256
        assert conditioned.wire["conditions"] == {"owner": {"absent": True}}
        assert conditioned.wire["if_revision"] == 0
    finally:
        sender.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_sources_token_opens_its_own_sources_outcomes_only(settings: Settings) -> None:
    # Given a source with its own outcomes token, and no global token
    sources = parse_sources(SOURCES)
    tokens = source_tokens(sources, {"BOOKINGS_OUTCOMES_TOKEN": BOOKINGS_TOKEN})
    assert tokens["bookings"].get_secret_value() == BOOKINGS_TOKEN
    gateway = ReceiverGateway.from_settings(settings)
    reads = OutcomeReads(settings, gateway, OutcomeWaits(gateway.outcome_feed), tokens)
    mine = f"Bearer {BOOKINGS_TOKEN}"
    # Then it reads its source's outcomes, not another's, which stay closed (403)
    assert reads.denied(mine, "bookings") is None
    assert getattr(reads.denied("Bearer wrong", "bookings"), "status_code", None) == 401
    assert getattr(reads.denied(mine, "shop"), "status_code", None) == 403
    # And with a global token too, the global one reads both, the source's its own only
    both = settings.model_copy(update={"outcomes_token": SecretStr(GLOBAL_TOKEN)})
    reads = OutcomeReads(both, gateway, reads.waits, tokens)
    assert reads.denied(f"Bearer {GLOBAL_TOKEN}", "shop") is None
    assert reads.denied(f"Bearer {GLOBAL_TOKEN}", "bookings") is None
    assert getattr(reads.denied(mine, "shop"), "status_code", None) == 401
    # And the variable must be set: the receiver does not start without it
    with pytest.raises(ConfigError, match="BOOKINGS_OUTCOMES_TOKEN"):
        source_tokens(sources, {})
    with pytest.raises(ConfigError, match="not an environment variable name"):
        parse_sources('[sources.x]\noutcomes_token_env = "not a name"\n')
    asyncio.run(gateway.close())


# -- real processes --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_python_sender_books_a_slot_and_is_told_and_a_retold_refusal_keeps_its_reason(
    stack: Stack, sender: Sender
) -> None:
    # Given a worker, and a Python sender
    worker = stack.worker(lanes=2)
    stack.wait_all_owned()
    # When two callers book the same slot, waiting to be told
    ada = sender.send(wait=10, **_slot("ada"))
    bob = sender.send(wait=10, **_slot("bob"))
    # Then the first is applied, with its revision and result; the second refused, saying why
    assert (ada.status, ada.revision, ada.decided) == ("applied", 1, True)
    assert ada.result == {"revision": 1, "fields": {"owner": "ada"}}
    assert (bob.status, bob.reason) == ("refused", "condition_unmet")
    assert bob.result is not None
    assert bob.result["seen"] == "ada"
    # And the refusal sent again is told again, replayed, with its reason
    again = sender.send(wait=10, **_slot("bob"))
    assert (again.status, again.reason, again.replayed) == ("refused", "condition_unmet", True)
    # And without waiting it is a duplicate, as before
    assert sender.send(**_slot("bob")).status == "duplicate"
    # And keylane outcome tells the same from Redis, exit code 0
    code, told = _outcome(stack, "demo", "book-1-bob")
    assert (code, told["from"], told["status"], told["reason"]) == (
        0,
        "redis",
        "refused",
        "condition_unmet",
    )
    # When Redis forgets the tell and the mark (past retention), Then the CLI reads the journal
    keys = stack.settings.keys
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    client.delete(keys.outcome("demo", "book-1-bob"))
    forget(client, keys, "demo", "book-1-bob")
    code, found = _outcome(stack, "demo", "book-1-bob")
    assert (code, found["from"], found["status"], found["revision"]) == (0, "journal", "refused", 1)
    # And the refusal delivered anew is re-told from the journal, with its reason
    retold = sender.send(wait=10, **_slot("bob"))
    assert (retold.status, retold.reason, retold.replayed) == ("refused", "condition_unmet", False)
    assert client.get(keys.outcome("demo", "book-1-bob")) is not None
    # And an event keylane never saw is unknown (3); one accepted, not decided, pending (1)
    assert _outcome(stack, "demo", "never")[0] == 3
    worker.stop()
    sender.send(**{**_slot("cid"), "record_key": "slot:2", "conditions": None})
    code, pending = _outcome(stack, "demo", "book-1-cid", "--wait", "1")
    assert (code, pending["status"]) == (1, "pending")
    assert stack.open_store().read("slot:1").fields == {"owner": "ada"}
    client.close()


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_task_sent_with_wait_is_told_what_it_returned_or_why_it_refused(
    stack: Stack, tmp_path: Path
) -> None:
    # Given the page's task module, myapp/tables.py as written, and a worker importing it
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    module = page_block("outcomes.md", "# myapp/tables.py")
    (tmp_path / "myapp" / "tables.py").write_text(module)
    stack.extra_env["PYTHONPATH"] = f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"
    stack.worker(lanes=2, app="myapp.tables")
    stack.wait_all_owned()
    # When the page's sender, send.py as written, runs from the folder that holds myapp/
    script = page_block("outcomes.md", "# send.py")
    (tmp_path / "send.py").write_text(script)
    env = {**os.environ, **settings_env(stack.settings), **stack.extra_env}
    run = subprocess.run(
        [sys.executable, "send.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it prints what the page says each send is told: the booking applied, the task's
    # return value, and the refusal with its reason
    assert run.returncode == 0, run.stdout + run.stderr
    lines = script.splitlines()
    shown = [line.split("  # ", 1)[1] for line in lines if "print(" in line and "  # " in line]
    assert len(shown) == 3
    assert run.stdout.splitlines() == shown, (run.stdout, shown)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_outcome_command_of_the_outcomes_page_runs_as_written(stack: Stack) -> None:
    # Given a deployment and an event decided through it
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    first = stack.post(
        event("evt_wait_1", "contact:wait", visits={"increment": 1}), prefer="wait=10"
    )
    assert first.status_code == 200, first.text
    # When the page's command is run as written (keylane on PATH: this checkout's)
    script = page_block("outcomes.md", "keylane outcome demo evt_wait_1")
    bin_dir = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).parents[1] / ".venv")) / "bin"
    env = {**settings_env(stack.settings), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    # Then it prints the told outcome and exits 0
    assert run.returncode == 0, run.stdout + run.stderr
    told = json.loads(run.stdout)
    assert (told["status"], told["revision"], told["from"]) == ("applied", 1, "redis")


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_sources_own_token_reads_through_the_receiver(stack: Stack, tmp_path: Path) -> None:
    # Given a receiver with a global token and a source with its own
    path = tmp_path / "sources.toml"
    path.write_text(SOURCES)
    stack.extra_env["BOOKINGS_OUTCOMES_TOKEN"] = BOOKINGS_TOKEN
    stack.receiver(sources_file=str(path), outcomes_token=GLOBAL_TOKEN)

    def asked(source: str, token: str) -> int:
        url = f"{stack.url}/outcomes/{source}/x"
        return httpx.get(url, headers={"authorization": f"Bearer {token}"}).status_code

    # Then the source's token reads its own (404: no such event), not another's (401)
    assert asked("bookings", BOOKINGS_TOKEN) == 404
    assert asked("shop", BOOKINGS_TOKEN) == 401
    # And the global token reads both
    assert asked("shop", GLOBAL_TOKEN) == asked("bookings", GLOBAL_TOKEN) == 404


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_1000_requests_waiting_at_once_on_one_receiver_are_each_told_truly(stack: Stack) -> None:
    # Given one receiver process and no worker yet: nothing is decided while they wait
    stack.receiver()
    count = 1000
    bodies = [event(f"m-{n}", f"many:{n}", n={"increment": 1}) for n in range(count)]
    client = redis.Redis.from_url(stack.settings.redis_dsn())

    async def post_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count + 10)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            url = f"{stack.url}/webhooks/demo"
            headers = {"prefer": "wait=30"}
            posts = [asyncio.create_task(http.post(url, json=b, headers=headers)) for b in bodies]
            # When all of them wait at once (accepted, registered) and a worker starts
            await asyncio.to_thread(
                wait_until,
                lambda: _accepted(stack, client) >= count,
                60,
                f"{count} accepted",
                lambda: str(_accepted(stack, client)) + stack.logs(),
            )
            # (one subscription for them all)
            assert client.pubsub_numsub(stack.settings.keys.outcomes)[0][1] == 1
            stack.worker(lanes=16)
            return list(await asyncio.gather(*posts))

    answers = asyncio.run(post_all())
    # Then each is answered its own event's outcome, or 202: never another's
    stack.wait_journal(count)
    store = stack.open_store()
    told = 0
    for n, answer in enumerate(answers):
        assert answer.status_code in (200, 202), (n, answer.text)
        body = answer.json()
        assert body["event_id"] == f"m-{n}"
        if body["status"] == "applied":
            told += 1
            entry = store.journal("demo", f"m-{n}")
            assert entry is not None
            assert body["revision"] == entry.revision == 1
    assert told >= count * 0.9, told
    client.close()


def _accepted(stack: Stack, client: redis.Redis) -> int:
    counters = client.hgetall(stack.settings.keys.counters)
    return int(counters.get(b"accepted", 0))
