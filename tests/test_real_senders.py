"""Real senders end to end: deliveries signed by the providers' own libraries (``stripe``,
``standardwebhooks``) or by their documented schemes (GitHub, Shopify), through a real
receiver process and worker, to records. Every refused delivery changes nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import stripe
from standardwebhooks.webhooks import Webhook

from tests.support.notion import NotionLike
from tests.support.readme import page_block_containing
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

EXAMPLE = Path(__file__).resolve().parents[1] / "ops" / "examples" / "sources.toml"
STRIPE_SECRET = "whsec_test_current_0123456789abcdef"
STRIPE_OLD = "whsec_test_previous_0123456789abcdef"
FORMS_SECRET = "whsec_" + base64.b64encode(b"forms-secret-32-bytes-long......").decode()
GITHUB_SECRET = "gh-secret-for-tests"
SHOPIFY_SECRET = "shpss_test_secret"
SECRETS = {
    "STRIPE_WEBHOOK_SECRET": STRIPE_SECRET,
    "STRIPE_WEBHOOK_SECRET_OLD": STRIPE_OLD,
    "FORMS_WEBHOOK_SECRET": FORMS_SECRET,
    "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
    "SHOPIFY_CLIENT_SECRET": SHOPIFY_SECRET,
}


def _start(stack: Stack, sources: Path = EXAMPLE) -> Stack:
    stack.settings = stack.settings.model_copy(update={"sources_file": sources})
    stack.extra_env.update(SECRETS)
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    return stack


def _send(stack: Stack, source: str, body: bytes, headers: dict[str, str]) -> Any:
    return stack.post(body, source=source, **headers)


def _state(stack: Stack) -> tuple[int, dict[str, int]]:
    return stack.open_store().journal_size(), stack.settled_counters()


def _stripe_invoice(event_id: str, customer: str, cents: int) -> bytes:
    return json.dumps(
        {
            "id": event_id,
            "object": "event",
            "type": "invoice.paid",
            "data": {
                "object": {"id": f"in_{event_id}", "customer": customer, "amount_paid": cents}
            },
        }
    ).encode()


def _stripe_headers(
    body: bytes, secret: str = STRIPE_SECRET, at: int | None = None
) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=at)
    return {"Stripe-Signature": header}


@pytest.mark.slow
def test_stripe_deliveries_signed_by_the_stripe_library(stack: Stack) -> None:
    _start(stack)
    # Given invoices signed by Stripe's own library, with the current and the old secret
    first = _stripe_invoice("evt_1", "cus_9", 1200)
    second = _stripe_invoice("evt_2", "cus_9", 800)
    assert _send(stack, "stripe", first, _stripe_headers(first)).status_code == 202
    assert _send(stack, "stripe", second, _stripe_headers(second, STRIPE_OLD)).status_code == 202
    stack.wait_journal(2)
    # Then both applied to the customer's record
    record = stack.open_store().read("customer:cus_9")
    assert record.fields == {
        "paid_total": 2000,
        "invoices": ["in_evt_1", "in_evt_2"],
        "status": "active",
    }
    # And Stripe's retry of evt_1 (a fresh signature) is a duplicate
    retry = _send(stack, "stripe", first, _stripe_headers(first))
    assert retry.status_code == 200
    # When deliveries are tampered with, signed wrongly, late, or unsigned
    before = _state(stack)
    third = _stripe_invoice("evt_3", "cus_9", 5)
    refused = {
        "tampered": (third.replace(b"5}", b"500}"), _stripe_headers(third)),
        "wrong secret": (third, _stripe_headers(third, "whsec_attacker")),
        "removed secret": (third, _stripe_headers(third, "whsec_rotated_out_long_ago")),
        "expired": (third, _stripe_headers(third, at=int(time.time()) - 600)),
        "from the future": (third, _stripe_headers(third, at=int(time.time()) + 600)),
        "missing header": (third, {}),
        "malformed header": (third, {"Stripe-Signature": "garbage"}),
    }
    for case, (body, headers) in refused.items():
        answer = _send(stack, "stripe", body, headers)
        # Then each is a 401 that says nothing secret
        assert answer.status_code == 401, case
        assert answer.json()["error"] == "bad_signature", case
        assert STRIPE_SECRET not in answer.text
    # And nothing changed
    assert _state(stack) == before


def _forms_delivery(
    msg_id: str, email: str, at: datetime | None = None, secret: str = FORMS_SECRET
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {
            "type": "form.submitted",
            "data": {
                "email": email,
                "name": "Ada",
                "company": "Analytical",
                "utm_source": "newsletter",
            },
        }
    )
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, at, body)
    return body.encode(), {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def test_form_tool_signed_with_standard_webhooks(stack: Stack) -> None:
    _start(stack)
    # Given a submission signed by the standardwebhooks library
    body, headers = _forms_delivery("msg_1", "ada@example.com")
    assert _send(stack, "forms", body, headers).status_code == 202
    # And the sender's retry: same webhook-id, new timestamp and signature
    later = datetime.now(UTC) + timedelta(seconds=5)
    body2, headers2 = _forms_delivery("msg_1", "ada@example.com", at=later)
    retry = _send(stack, "forms", body2, headers2)
    assert retry.status_code == 200
    stack.wait_journal(1)
    record = stack.open_store().read("lead:ada@example.com")
    assert record.fields == {
        "name": "Ada",
        "company": "Analytical",
        "utm_sources": ["newsletter"],
        "submissions": 1,
    }
    # When a delivery is expired, wrongly signed or tampered with, it is a 401
    before = _state(stack)
    old, old_headers = _forms_delivery(
        "msg_2", "x@example.com", at=datetime.now(UTC) - timedelta(minutes=10)
    )
    assert _send(stack, "forms", old, old_headers).status_code == 401
    wrong_secret = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long.").decode()
    bad, bad_headers = _forms_delivery("msg_3", "x@example.com", secret=wrong_secret)
    assert _send(stack, "forms", bad, bad_headers).status_code == 401
    good, good_headers = _forms_delivery("msg_4", "x@example.com")
    assert _send(stack, "forms", good.replace(b"Ada", b"Eve"), good_headers).status_code == 401
    assert _send(stack, "forms", good, {}).status_code == 401
    assert _state(stack) == before


def test_the_readme_sender_scripts_run_as_written(stack: Stack, tmp_path: Path) -> None:
    _start(stack)
    # Given the sources page's two worked examples' scripts, signed by the providers' own libraries,
    # run as written against this stack's receiver (not on :8000) with the example secrets
    env = {**os.environ, **SECRETS}
    scripts = {
        "send_invoice.py": page_block_containing("sources.md", "stripe.WebhookSignature"),
        "send_form.py": page_block_containing("sources.md", "from standardwebhooks"),
    }
    printed = {}
    for name, text in scripts.items():
        (tmp_path / name).write_text(text.replace("http://127.0.0.1:8000", stack.url))
        done = subprocess.run(
            [sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        printed[name] = done.stdout
    # Then each prints the 202 the page shows under it
    assert printed["send_invoice.py"].startswith("202 {'status': 'accepted'"), printed
    assert "'record_key': 'customer:cus_9'" in printed["send_invoice.py"]
    assert printed["send_form.py"].startswith("202 "), printed
    assert "'record_key': 'lead:ada@example.com'" in printed["send_form.py"]
    # And the records hold what the page shows
    stack.wait_journal(2)
    shown = page_block_containing("sources.md", "keylane records get customer:cus_9")
    shown = shown.splitlines()[1:]
    customer = stack.open_store().read("customer:cus_9")
    assert [f"#   {k} = {json.dumps(v)}" for k, v in sorted(customer.fields.items())] == shown[1:]
    lead = stack.open_store().read("lead:ada@example.com")
    assert lead.fields == {
        "company": "Analytical",
        "name": "Ada",
        "submissions": 1,
        "utm_sources": ["newsletter"],
    }


def test_github_and_shopify_by_their_documented_schemes(stack: Stack) -> None:
    _start(stack)
    # Given a GitHub star event signed as GitHub documents it
    star = json.dumps(
        {"action": "created", "repository": {"full_name": "octo/hello", "stargazers_count": 42}}
    ).encode()
    digest = hmac.new(GITHUB_SECRET.encode(), star, hashlib.sha256).hexdigest()
    headers = {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Event": "star",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    }
    assert _send(stack, "github", star, headers).status_code == 202
    assert _send(stack, "github", star, headers).status_code == 200  # a redelivery
    bad = {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}
    assert _send(stack, "github", star, bad).status_code == 401
    # And a Shopify order signed as Shopify documents it, mapped by a Python hook
    order = json.dumps(
        {"id": 450789469, "total_price": "19.99", "customer": {"id": 207119551}}
    ).encode()
    mac = base64.b64encode(hmac.new(SHOPIFY_SECRET.encode(), order, hashlib.sha256).digest())
    shop = {
        "X-Shopify-Hmac-Sha256": mac.decode(),
        "X-Shopify-Topic": "orders/create",
        "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
    }
    assert _send(stack, "shopify", order, shop).status_code == 202
    assert (
        _send(stack, "shopify", order, {**shop, "X-Shopify-Hmac-Sha256": "AAAA"}).status_code == 401
    )
    # Then both records are written
    stack.wait_journal(2)
    store = stack.open_store()
    assert store.read("repo:octo/hello").fields == {"stars": 42}
    assert store.read("shopify-customer:207119551").fields == {
        "orders": [450789469],
        "spent_cents": 1999,
    }


KEYLESS_SOURCES = """
[sources.hashed]
missing_id = "content-hash"
[sources.unique]
missing_id = "unique"
[sources.shortlived]
retention_s = 1
"""


def _keyless(n: int, key: str = "tally:1") -> dict[str, Any]:
    return {
        "type": "tick",
        "record_key": key,
        "changes": {"n": {"increment": 1}, "seen": {"append": n}},
    }


def test_keyless_deliveries_are_each_applied_and_never_collide(
    stack: Stack, tmp_path: Path
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text(KEYLESS_SOURCES)
    _start(stack, sources)
    # Given 100 distinct events without an id, two of them sent twice
    bodies = [_keyless(n) for n in range(100)] + [_keyless(7), _keyless(42)]
    # When they go to a source that falls back to the body's hash
    answers = [stack.post(b, source="hashed") for b in bodies]
    # Then 100 are accepted (each saying its key was missing), the two re-sends are
    # duplicates, and 100 are applied: none dropped, none doubled
    assert [a.status_code for a in answers].count(202) == 100
    assert [a.status_code for a in answers[100:]] == [200, 200]
    assert all(a.json()["key_missing"] for a in answers[:100])
    stack.wait_journal(100)
    record = stack.open_store().read("tally:1")
    assert record.fields["n"] == 100
    assert sorted(record.fields["seen"]) == list(range(100))
    # And when they go to a source that gives each keyless delivery its own id
    answers = [stack.post(_keyless(n, "tally:2"), source="unique") for n in [1, 2, 2]]
    # Then none is taken for another: every delivery is accepted and applied
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert len({a.json()["event_id"] for a in answers}) == 3
    stack.wait_journal(103)
    assert stack.open_store().read("tally:2").fields["n"] == 3
    assert stack.settled_counters()["keyless"] == 103


@pytest.mark.slow
def test_a_replay_after_the_dedupe_window_has_no_second_effect(
    stack: Stack, tmp_path: Path
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text(KEYLESS_SOURCES)
    _start(stack, sources)
    body = {"id": "late-1", "type": "t", "record_key": "late:1", "changes": {"n": {"increment": 5}}}
    # Given an event delivered and applied under a one-second dedupe window
    assert stack.post(body, source="shortlived").status_code == 202
    stack.wait_journal(1)
    # When the sender replays it after the window
    time.sleep(3)  # past the window: an id is forgotten up to 2 s after it, never before
    replay = stack.post(body, source="shortlived")
    # Then Redis no longer knows it, but the store's journal does: no second effect
    assert replay.status_code == 202
    wait_until(
        lambda: stack.view().counters().get("duplicate", 0) == 1,
        20,
        "the lane to recognise the replay",
    )
    record = stack.open_store().read("late:1")
    assert record.fields == {"n": 5}
    assert record.revision == 1


def test_the_readme_signup_source_dedupes_a_senders_retry(stack: Stack, tmp_path: Path) -> None:
    # Given the destinations page's signup source as written (Standard Webhooks, no event_id), its
    # task (the test suite's search-then-create sync_contact) against a local CRM
    sources = tmp_path / "sources.toml"
    sources.write_text(page_block_containing("destinations.md", "[sources.signup]"))
    crm = NotionLike(seed=5).start()
    try:
        stack.settings = stack.settings.model_copy(
            update={"sources_file": sources, "app": "tests.support.user_tasks"}
        )
        stack.extra_env.update(SIGNUP_SECRET=FORMS_SECRET, TEST_CRM_URL=crm.url)
        stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned()
        # When a sender signs a signup as msg_0, then retries it (new timestamp, signature)
        body = json.dumps({"email": "ada@example.com", "plan": "pro", "seq": 1})
        answers = []
        for at in (datetime.now(UTC), datetime.now(UTC) + timedelta(seconds=30)):
            signature = Webhook(FORMS_SECRET).sign("msg_0", at, body)
            headers = {
                "webhook-id": "msg_0",
                "webhook-timestamp": str(int(at.timestamp())),
                "webhook-signature": signature,
            }
            answers.append(_send(stack, "signup", body.encode(), headers))
        # Then the first is accepted under the sender's id, and the retry is its duplicate
        # (answered the first answer, or what became of the event once the lane decided it)
        first, retry = answers
        assert first.status_code == 202, first.text
        assert first.json()["event_id"] == "msg_0"
        assert "key_missing" not in first.json()
        assert retry.status_code == 200
        told = retry.json()
        assert told == first.json() or (told["status"], told["event_id"]) == ("applied", "msg_0")
        assert retry.headers["keylane-replayed"] == "true"
        # And the task ran once: one contact page with the one update
        stack.wait_journal(1)
        wait_until(lambda: bool(crm.pages_by_email()), 30, "the CRM page")
        pages = crm.pages_by_email()
        assert [page["updates"] for page in pages["ada@example.com"]] == [[1]]
    finally:
        crm.stop()
