"""The senders beyond the first fifteen (presets/sales.py, presets/builders.py): each
delivery built and signed as its sender documents (tests/support/signers.py), through a
real receiver and worker, applied to the right record; sent again as the sender retries
it: a duplicate; forged: 401 and nothing recorded; Notion's token kept from its
handshake. What they brought to the core, alone: tests/test_senders_parts.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.signers import SIGNERS, Outgoing
from tests.support.stack import Stack

PUBLIC_URL = "https://hooks.example.com"

SECRETS = {
    "close": "058bfb6a3d8cfdc4da7c3be5901b16ae11da982b46a25fb2cd7016e97a140a1c",
    "attio": "attio-test-secret",
    "zendesk": "zendesk-test-secret",
    "square": "square-test-signature-key",
    "tally": "tally-test-secret",
    "formstack": "formstack-test-key",
    "calcom": "calcom-test-secret",
    "webflow": "webflow-test-secret",
    "airtable": base64.b64encode(b"airtable-test-mac-secret-32bytes").decode(),
}
# A forger's secret of the same form (Close's and Airtable's keys are decoded first).
FORGED = {
    "close": "00" * 32,
    "airtable": base64.b64encode(b"someone-else-entirely-32-bytes!!").decode(),
}


def env_name(sender: str) -> str:
    return f"{sender.upper()}_SECRET"


@dataclass
class Sent:
    """One sender's delivery, what it should become, and its retry."""

    sender: str
    body: bytes
    record_key: str
    fields: dict[str, Any]
    mapping: str  # the source's record_key and on table
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    events: int = 1


CASES = [
    Sent(
        "close",
        json.dumps(
            {
                "subscription_id": "whsub_1",
                "event": {
                    "id": "ev_1",
                    "object_type": "opportunity",
                    "action": "updated",
                    "object_id": "oppo_1",
                    "data": {"status_label": "Won"},
                },
            }
        ).encode(),
        "opportunity:oppo_1",
        {"status": "Won"},
        'record_key = "opportunity:{body:event.object_id}"\n'
        '[sources.close.on."opportunity.updated"]\n'
        'status = { set = "body:event.data.status_label" }\n',
    ),
    Sent(
        "attio",
        json.dumps(
            {
                "webhook_id": "wh_1",
                "events": [
                    {
                        "event_type": "record.updated",
                        "id": {"record_id": "rec_1", "attribute_id": "a"},
                    },
                    # the same change again in the same message: its own event all the same
                    {
                        "event_type": "record.updated",
                        "id": {"record_id": "rec_1", "attribute_id": "a"},
                    },
                ],
            }
        ).encode(),
        "attio:rec_1",
        {"changes": 2},
        'record_key = "attio:{body:id.record_id}"\n'
        '[sources.attio.on."record.updated"]\n'
        "changes = { increment = 1 }\n",
        headers={"Idempotency-Key": "idem-1"},
        events=2,
    ),
    Sent(
        "zendesk",
        json.dumps(
            {
                "type": "zen:event-type:user.created",
                "id": "zd-ev-1",
                "detail": {"id": "456", "email": "ann@example.com"},
            }
        ).encode(),
        "user:456",
        {"email": "ann@example.com"},
        'record_key = "user:{body:detail.id}"\n'
        '[sources.zendesk.on."zen:event-type:user.created"]\n'
        'email = { set = "body:detail.email" }\n',
    ),
    Sent(
        "square",
        json.dumps(
            {
                "type": "payment.created",
                "event_id": "sq-ev-1",
                "data": {"id": "pay_1", "object": {"payment": {"customer_id": "cust_1"}}},
            }
        ).encode(),
        "customer:cust_1",
        {"last_payment": "pay_1"},
        'record_key = "customer:{body:data.object.payment.customer_id}"\n'
        '[sources.square.on."payment.created"]\n'
        'last_payment = { set = "body:data.id" }\n',
    ),
    Sent(
        "tally",
        json.dumps(
            {
                "eventId": "tally-ev-1",
                "eventType": "FORM_RESPONSE",
                "data": {"fields": [{"label": "Email", "value": "tally@example.com"}]},
            }
        ).encode(),
        "lead:tally@example.com",
        {"submissions": 1},
        'record_key = "lead:{body:data.fields.0.value}"\n'
        "[sources.tally.on.FORM_RESPONSE]\n"
        "submissions = { increment = 1 }\n",
    ),
    Sent(
        "formstack",
        b"FormID=6606394&UniqueID=1500878955&email=fs%40example.com&name=Ann",
        "lead:fs@example.com",
        {"name": "Ann"},
        'record_key = "lead:{body:email}"\n'
        '[sources.formstack.on."*"]\n'
        'name = { set = "body:name" }\n',
        content_type="application/x-www-form-urlencoded; charset=utf-8",
    ),
    Sent(
        "calcom",
        json.dumps(
            {
                "triggerEvent": "BOOKING_CREATED",
                "createdAt": "2026-01-01T00:00:00.000Z",
                "payload": {"uid": "bk_1", "attendees": [{"email": "cal@example.com"}]},
            }
        ).encode(),
        "lead:cal@example.com",
        {"booking": "bk_1"},
        'record_key = "lead:{body:payload.attendees.0.email}"\n'
        "[sources.calcom.on.BOOKING_CREATED]\n"
        'booking = { set = "body:payload.uid" }\n',
    ),
    Sent(
        "webflow",
        json.dumps(
            {
                "triggerType": "form_submission",
                "payload": {"id": "sub_1", "data": {"email": "wf@example.com", "Name": "Ann"}},
            }
        ).encode(),
        "lead:wf@example.com",
        {"name": "Ann"},
        'record_key = "lead:{body:payload.data.email}"\n'
        "[sources.webflow.on.form_submission]\n"
        'name = { set = "body:payload.data.Name" }\n',
    ),
    Sent(
        "airtable",
        json.dumps(
            {
                "base": {"id": "appABC"},
                "webhook": {"id": "achXYZ"},
                "timestamp": "2026-01-01T00:00:00.000Z",
            }
        ).encode(),
        "base:appABC",
        {"notifications": 1},
        'record_key = "base:{body:base.id}"\n'
        '[sources.airtable.on."*"]\n'
        "notifications = { increment = 1 }\n",
    ),
]


def sources_file(tmp_path: Path) -> Path:
    tables = []
    for case in CASES:
        tables.append(
            f"[sources.{case.sender}]\n"
            f'verify = {{ scheme = "{case.sender}", secrets_env = ["{env_name(case.sender)}"] }}\n'
            'format = "mapped"\n' + case.mapping
        )
    path = tmp_path / "sources.toml"
    path.write_text("\n".join(tables))
    return path


def signed(case: Sent, secret: str, at: int) -> dict[str, str]:
    url = f"{PUBLIC_URL}/webhooks/{case.sender}"
    out = Outgoing(case.body, url, "POST", {k.lower(): v for k, v in case.headers.items()})
    return {
        "content-type": case.content_type,
        **case.headers,
        **SIGNERS[case.sender](secret, out, at),
    }


def send(stack: Stack, source: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{stack.url}/webhooks/{source}", content=body, headers=headers, timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_each_sender_applied_retried_and_forged(stack: Stack, tmp_path: Path) -> None:
    # Given one deployment with a source for each sender, and the URL senders call
    stack.settings = stack.settings.model_copy(
        update={"sources_file": sources_file(tmp_path), "public_url": PUBLIC_URL}
    )
    stack.extra_env.update({env_name(s): secret for s, secret in SECRETS.items()})
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    journal = 0
    for case in CASES:
        # When its delivery comes, signed as the sender signs it
        now = int(time.time())
        first = send(stack, case.sender, case.body, signed(case, SECRETS[case.sender], now))
        assert first.status_code == 202, (case.sender, first.text)
        journal += case.events
        stack.wait_journal(journal)
        # Then it is applied to its record
        record = stack.open_store().read(case.record_key)
        assert record is not None, case.sender
        assert record.fields == case.fields, case.sender
        # And the sender's retry (signed again, a second later) is a duplicate
        retry = send(stack, case.sender, case.body, signed(case, SECRETS[case.sender], now + 1))
        assert retry.status_code == 200, (case.sender, retry.text)
        # When a delivery is forged: signed with another secret, or its body changed
        before = (stack.open_store().journal_size(), stack.settled_counters())
        wrong = FORGED.get(case.sender, "not-the-" + SECRETS[case.sender])
        forged = send(stack, case.sender, case.body, signed(case, wrong, now))
        tampered_body = case.body.replace(b"1", b"2", 1)
        tampered = send(stack, case.sender, tampered_body, signed(case, SECRETS[case.sender], now))
        # Then each is a 401 and nothing is recorded
        for answer in (forged, tampered):
            assert answer.status_code == 401, (case.sender, answer.text)
            assert answer.json()["error"] == "bad_signature"
        assert (stack.open_store().journal_size(), stack.settled_counters()) == before
    # And every record holds what its deliveries said, once
    assert stack.open_store().journal_size() == journal


def notion_event(event_id: str, page: str, attempt: int) -> bytes:
    return json.dumps(
        {
            "id": event_id,
            "timestamp": "2026-01-01T00:00:00.000Z",
            "workspace_id": "ws-1",
            "subscription_id": "sub-1",
            "integration_id": "int-1",
            "type": "page.content_updated",
            "authors": [{"id": "u-1", "type": "person"}],
            "attempt_number": attempt,
            "entity": {"id": page, "type": "page"},
            "data": {"parent": {"id": "db-1", "type": "database"}},
        }
    ).encode()


def notion_signed(token: str, body: bytes) -> dict[str, str]:
    digest = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    return {"content-type": "application/json", "X-Notion-Signature": f"sha256={digest}"}


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_notion_s_token_is_kept_shown_and_signs_its_deliveries(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a Notion source with no secret of its own (Notion hands it over)
    stack.use_sources(
        '[sources.notion]\nverify = { scheme = "notion" }\nformat = "mapped"\n'
        'record_key = "page:{body:entity.id}"\n'
        '[sources.notion.on."page.content_updated"]\nedits = { increment = 1 }\n'
    )
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    plain = {"content-type": "application/json"}
    # When Notion's verification request comes (unsigned)
    token = "secret_" + "t0k3n" * 8
    handshake = json.dumps({"verification_token": token}).encode()
    assert send(stack, "notion", handshake, plain).status_code == 200
    # Then nothing is recorded, and the operator can read the token for Notion's Verify
    assert stack.open_store().journal_size() == 0
    shown = stack.keylane("sources", "show-secret", "notion")
    assert (shown.returncode, shown.stdout.strip()) == (0, token), shown.stderr
    # When an event comes signed with it, then its retry (attempt_number raised)
    first = send(
        stack,
        "notion",
        notion_event("ev-1", "pg-1", 1),
        notion_signed(token, notion_event("ev-1", "pg-1", 1)),
    )
    assert first.status_code == 202, first.text
    stack.wait_journal(1)
    retry_body = notion_event("ev-1", "pg-1", 2)
    retry = send(stack, "notion", retry_body, notion_signed(token, retry_body))
    # Then the event is applied once and the retry is a duplicate
    assert retry.status_code == 200, retry.text
    assert stack.open_store().read("page:pg-1").fields == {"edits": 1}
    # When a delivery is signed with another token, or another verification comes
    before = (stack.open_store().journal_size(), stack.settled_counters())
    forged_body = notion_event("ev-2", "pg-1", 1)
    forged = send(stack, "notion", forged_body, notion_signed("secret_other", forged_body))
    other = send(
        stack, "notion", json.dumps({"verification_token": "secret_other"}).encode(), plain
    )
    # Then the first is a 401, the second a 409 (the kept token stays), nothing recorded
    assert forged.status_code == 401, forged.text
    assert other.status_code == 409, other.text
    assert (stack.open_store().journal_size(), stack.settled_counters()) == before
    # And once the operator forgets it, a new subscription's token is kept
    assert stack.keylane("sources", "forget-secret", "notion").returncode == 0
    assert (
        send(
            stack, "notion", json.dumps({"verification_token": "secret_new"}).encode(), plain
        ).status_code
        == 200
    )
    assert stack.keylane("sources", "show-secret", "notion").stdout.strip() == "secret_new"
