"""``keylane send SOURCE --file body.json`` against a real receiver and worker: a delivery
signed as the source's sender signs it is applied to its record (GitHub's id in a header,
Stripe's in the body, Twilio's signature over the public URL), a source without a secret
sends unsigned, and what cannot be sent says why."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.senders import applied, sender_deployment
from tests.support.stack import Stack, settings_env

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
    refused = _send(stack, tmp_path, "stripe", "--file", "invoice.json", "--event-id", "x")
    assert refused.returncode == 2
    assert "reads its event id from body:id" in refused.stderr


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


def test_what_cannot_be_sent_says_why_and_exits_2(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text("{}")
    # An unknown source names the sources there are
    unknown = _send(stack, tmp_path, "nope", "--file", "b.json")
    assert unknown.returncode == 2
    assert "no source named 'nope' (sources: forms, github, stripe, twilio)" in unknown.stderr
    # A secret not set names its variable, never a value
    unset = _send(stack, tmp_path, "stripe", "--file", "b.json", environ={"STRIPE_SECRET": ""})
    assert unset.returncode == 2
    assert "STRIPE_SECRET is empty" in unset.stderr
    # No receiver there: says where it tried
    away = _send(stack, tmp_path, "forms", "--file", "b.json", "--url", "http://127.0.0.1:9/x")
    assert away.returncode == 2
    assert "could not send to http://127.0.0.1:9/x" in away.stderr


def test_an_answer_that_is_not_2xx_exits_1_with_its_status_and_body(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a body the source refuses (not keylane's envelope)
    (tmp_path / "bad.json").write_text('{"id": "evt_bad"}')
    sent = _send(stack, tmp_path, "forms", "--file", "bad.json")
    assert sent.returncode == 1
    assert sent.stdout.startswith("400 Bad Request\n"), sent.stdout
    assert '"error"' in sent.stdout
