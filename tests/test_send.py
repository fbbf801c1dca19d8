"""``keylane send SOURCE --file body.json`` against a real receiver and worker: a delivery
signed as the source's sender signs it is applied to its record (GitHub's id in a header,
Stripe's in the body, Twilio's signature over the public URL), a source without a secret
sends unsigned, and what cannot be sent says why."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.readme import page_text
from tests.support.senders import applied, send, sender_deployment
from tests.support.stack import Stack, settings_env, wait_until

SECRETS = {
    "GITHUB_WEBHOOK_SECRET": "send-tests-github-secret",
    "STRIPE_SECRET": "whsec_send_tests_0123456789",
    "TWILIO_AUTH_TOKEN": "send-tests-twilio-token",
}

SOURCES = """
[sources.github]
verify = { scheme = "github", secrets_env = ["GITHUB_WEBHOOK_SECRET"] }
format = "mapped"
record_key = "repo:{body:repository.full_name}"

[sources.github.on.star]
stars = { set = "body:repository.stargazers_count" }

[sources.stripe]
verify = { scheme = "stripe", secrets_env = ["STRIPE_SECRET"] }
format = "mapped"
record_key = "customer:{body:data.object.customer}"
on."invoice.paid".paid_cents = { increment = "body:data.object.amount_paid" }

[sources.twilio]
verify = { scheme = "twilio", secrets_env = ["TWILIO_AUTH_TOKEN"] }
format = "mapped"
record_key = "phone:{body:From}"
on."*".last_message = { set = "body:Body" }

[sources.forms]
verify = { scheme = "none" }

[sources.asana]
verify = { scheme = "asana" }
format = "mapped"
record_key = "task:{body:resource.gid}"
on."task.changed".changed = { add = "body:change.field" }
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with sender_deployment(redis_url, tmp_path_factory.mktemp("send"), SOURCES, SECRETS) as s:
        yield s


def _send(
    stack: Stack, tmp: Path, *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``keylane send ARGS`` from ``tmp``, to the stack's receiver by its port (the default
    URL: this deployment's receiver), with the secrets in the environment."""
    port = stack.url.rsplit(":", 1)[1]
    env = {**settings_env(stack.settings), **SECRETS, "KEYLANE_PORT": port}
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "send", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _says_why(sent: subprocess.CompletedProcess[str], why: str) -> None:
    """Nothing was sent: exit code 2 and ``why`` on stderr."""
    assert sent.returncode == 2, sent.stdout + sent.stderr
    assert why in sent.stderr


@pytest.mark.slow
def test_a_github_delivery_is_signed_and_applied_with_a_new_id_each_time(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a star event as GitHub sends it (its type in a header)
    body = {"action": "created", "repository": {"full_name": "acme/send", "stargazers_count": 7}}
    (tmp_path / "star.json").write_text(json.dumps(body))
    # When keylane send sends it as GitHub would
    sent = _send(
        stack, tmp_path, "github", "--file", "star.json", "--header", "X-GitHub-Event: star"
    )
    # Then the receiver verified it (202), the answer is printed, and the event applies
    assert sent.returncode == 0, sent.stdout + sent.stderr
    status, answer = sent.stdout.split("\n", 1)
    assert status == "202 Accepted"
    accepted = json.loads(answer)
    assert (accepted["status"], accepted["record_key"]) == ("accepted", "repo:acme/send")
    assert accepted["event_id"].startswith("send_")
    assert f"event id {accepted['event_id']}" in sent.stderr
    applied(stack, "repo:acme/send", {"stars": 7})
    # And sent again, it is a new event (a new X-GitHub-Delivery); with --event-id, the
    # id given, and that id again is a duplicate
    again = _send(
        stack,
        tmp_path,
        "github",
        "--file",
        "star.json",
        "--header",
        "X-GitHub-Event: star",
        "--event-id",
        "delivery-1",
    )
    assert again.stdout.startswith("202 Accepted\n"), again.stdout + again.stderr
    assert json.loads(again.stdout.split("\n", 1)[1])["event_id"] == "delivery-1"
    twice = _send(
        stack,
        tmp_path,
        "github",
        "--file",
        "star.json",
        "--header",
        "X-GitHub-Event: star",
        "--event-id",
        "delivery-1",
    )
    assert twice.returncode == 0
    assert twice.stdout.startswith("200 OK\n"), twice.stdout


@pytest.mark.slow
def test_a_stripe_delivery_is_signed_with_its_id_in_the_body(stack: Stack, tmp_path: Path) -> None:
    # Given an invoice.paid event, its id in the body
    body = {
        "id": "evt_send_1",
        "type": "invoice.paid",
        "data": {"object": {"customer": "cus_send", "amount_paid": 1200}},
    }
    (tmp_path / "invoice.json").write_text(json.dumps(body))
    # When it is sent twice
    first = _send(stack, tmp_path, "stripe", "--file", "invoice.json")
    second = _send(stack, tmp_path, "stripe", "--file", "invoice.json")
    # Then the first is accepted, the second is the same event (a duplicate), applied once
    assert first.stdout.startswith("202 Accepted\n"), first.stdout + first.stderr
    assert second.stdout.startswith("200 OK\n"), second.stdout + second.stderr
    applied(stack, "customer:cus_send", {"paid_cents": 1200})
    # And an id in the body cannot be overridden: the command says where it is
    _says_why(
        _send(stack, tmp_path, "stripe", "--file", "invoice.json", "--event-id", "x"),
        "reads its event id from body:id",
    )


def test_twilio_is_signed_over_the_public_url_the_receiver_checks(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a Twilio form (its signature covers KEYLANE_PUBLIC_URL, not the local URL)
    (tmp_path / "sms.form").write_text("Body=hello+send&From=%2B15550109999&MessageSid=SM9")
    # When it is sent to the local receiver
    sent = _send(stack, tmp_path, "twilio", "--file", "sms.form")
    # Then it verifies and applies (its answer is Twilio's TwiML)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "<Response" in sent.stdout
    applied(stack, "phone:+15550109999", {"last_message": "hello send"})


def test_a_source_without_a_secret_sends_unsigned(stack: Stack, tmp_path: Path) -> None:
    envelope = {
        "id": "evt_forms_1",
        "type": "contact.updated",
        "record_key": "contact:send",
        "changes": {"visits": {"increment": 1}},
    }
    (tmp_path / "event.json").write_text(json.dumps(envelope))
    sent = _send(stack, tmp_path, "forms", "--file", "event.json")
    assert sent.stdout.startswith("202 Accepted\n"), sent.stdout + sent.stderr
    applied(stack, "contact:send", {"visits": 1})


def test_asana_is_signed_with_the_secret_kept_from_its_handshake(
    stack: Stack, tmp_path: Path
) -> None:
    # Given an Asana source whose secret is handed over in its handshake, none yet
    events = {
        "events": [
            {
                "action": "changed",
                "resource": {"gid": "77", "resource_type": "task"},
                "change": {"field": "assignee"},
                "created_at": "2026-01-01T00:00:00Z",
            }
        ]
    }
    (tmp_path / "events.json").write_text(json.dumps(events))
    _says_why(_send(stack, tmp_path, "asana", "--file", "events.json"), "no secret is kept yet")
    # When Asana's handshake hands one over, then the same file is sent
    secret = uuid.uuid4().hex
    handshake = send(stack, "asana", b"", {"X-Hook-Secret": secret}, content_type=None)
    assert handshake.status_code == 200, handshake.text
    sent = _send(stack, tmp_path, "asana", "--file", "events.json")
    # Then it is signed with the kept secret, verified and applied
    assert sent.stdout.startswith("202 Accepted\n"), sent.stdout + sent.stderr
    applied(stack, "task:77", {"changed": ["assignee"]})


@pytest.mark.slow
def test_what_cannot_be_sent_says_why_and_exits_2(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text("{}")
    # An unknown source names the sources there are
    _says_why(
        _send(stack, tmp_path, "nope", "--file", "b.json"),
        "no source named 'nope' (sources: asana, forms, github, stripe, twilio)",
    )
    # A secret not set names its variable, never a value
    _says_why(
        _send(stack, tmp_path, "stripe", "--file", "b.json", environ={"STRIPE_SECRET": ""}),
        "STRIPE_SECRET is empty",
    )
    # No receiver there: says where it tried
    _says_why(
        _send(stack, tmp_path, "forms", "--file", "b.json", "--url", "http://127.0.0.1:9/x"),
        "could not send to http://127.0.0.1:9/x",
    )


def test_an_answer_that_is_not_2xx_exits_1_with_its_status_and_body(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a body the source refuses (not keylane's envelope)
    (tmp_path / "bad.json").write_text('{"id": "evt_bad"}')
    sent = _send(stack, tmp_path, "forms", "--file", "bad.json")
    assert sent.returncode == 1
    assert sent.stdout.startswith("400 Bad Request\n"), sent.stdout
    assert '"error"' in sent.stdout


# -- the Senders page's example, as written ----------------------------------------------

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
SHARD = re.compile(r'"shard":\d+,"queue":"keylane\.shard\.\d+"')


def _blocks(text: str) -> dict[str, str]:
    """The code blocks of ``text`` by info string (one of each here)."""
    chunks = [chunk.partition("\n") for chunk in text.split("```")[1::2]]
    return {info.strip(): body for info, _, body in chunks}


def _same(shown: list[str], got: list[str]) -> None:
    """``got`` is what the page shows, a time and a shard aside; a shown line ending in
    ``…`` is the start of the line."""
    assert len(got) >= len(shown), (shown, got)
    for want, line in zip(shown, got, strict=False):
        want, line = (SHARD.sub("S", TIMESTAMP.sub("T", text)) for text in (want, line))
        if want.endswith("…"):
            assert line.startswith(want[:-1]), (want, line)
        else:
            assert line == want


def _once_applied(stack: Stack, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``keylane ARGS`` (a ``records get``) once it finds the record: once the lane has
    applied the event, as the page says."""
    wait_until(lambda: stack.keylane(*args).returncode == 0, 60, "the record applied")
    return stack.keylane(*args)


@pytest.mark.slow
def test_the_senders_page_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    # Given the page's sources file, event and commands, and a deployment of that file
    # with the secret its export line sets
    page = page_text("senders.md")
    heading = "\n### Trying a mapping without the provider\n"
    # (to the next heading; page_section would take a "# " line of output for a heading)
    blocks = _blocks(page.split(heading, 1)[1].split("\n### ", 1)[0])
    (tmp_path / "sources.toml").write_text(blocks["toml"])
    (tmp_path / "invoice.json").write_text(blocks["json"])
    lines = blocks["sh"].splitlines()
    exported = dict(pair.split("=", 1) for pair in shlex.split(lines[0])[1:])
    secrets = {k: v for k, v in exported.items() if not k.startswith("KEYLANE_")}
    (tmp_path / "run").mkdir()
    with sender_deployment(redis_url, tmp_path / "run", blocks["toml"], secrets) as stack:
        commands = [n for n, line in enumerate(lines) if line.startswith("keylane ")]
        for n, end in zip(commands, [*commands[1:], len(lines)], strict=True):
            # When each command is run as typed, in the folder of the two files
            argv = shlex.split(lines[n], comments=True)
            shown = [line.removeprefix("# ") for line in lines[n + 1 : end]]
            assert argv[:2] in (["keylane", "send"], ["keylane", "records"]), argv
            if argv[1] == "send":
                got = _send(stack, tmp_path, *argv[2:], environ=exported)
            else:
                got = _once_applied(stack, argv[1:])
            # Then it prints what the page shows
            _same(shown, got.stdout.splitlines())
