"""Billing senders as they send (issue 47): Paddle Billing, Stripe, and senders built on
Svix (Standard Webhooks with Svix's own ``svix-*`` header names), each delivery signed
by the provider's own SDK (``paddle_billing``, ``stripe``, ``svix``), through a real
receiver and worker: applied to its record, a retry (signed anew) a duplicate, a
forgery a 401 that records nothing."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import stripe
from paddle_billing.Notifications import Secret, Verifier
from paddle_billing.Notifications.PaddleSignature import PaddleSignature
from svix.webhooks import Webhook as SvixWebhook

from tests.support.senders import (
    applied,
    refused_changes_nothing,
    replayed,
    send,
    sender_deployment,
)
from tests.support.stack import Stack

PADDLE_SECRET = "pdl_ntfset_01hv8x2mq6-test-secret"
STRIPE_SECRET = "whsec_billing_tests_0123456789abcdef"
SVIX_SECRET = "whsec_" + base64.b64encode(b"svix-sender-secret-of-32-bytes!!").decode()
SECRETS = {
    "PADDLE_SECRET": PADDLE_SECRET,
    "STRIPE_SECRET": STRIPE_SECRET,
    "SVIX_SECRET": SVIX_SECRET,
}

SOURCES = """
[sources.paddle]
verify = {scheme = "paddle", secrets_env = ["PADDLE_SECRET"]}
format = "mapped"
record_key = "customer:{body:data.customer_id}"
on."transaction.completed".paid = {append = "body:data.id"}
on."subscription.updated".status = {set = "body:data.status"}

[sources.stripe]
verify = {scheme = "stripe", secrets_env = ["STRIPE_SECRET"]}
format = "mapped"
record_key = "customer:{body:data.object.customer}"
on."invoice.paid".paid_cents = {increment = "body:data.object.amount_paid"}

[sources.svix]
verify = {scheme = "standard_webhooks", secrets_env = ["SVIX_SECRET"]}
format = "mapped"
record_key = "user:{body:data.id}"
on."user.created".email = {set = "body:data.email_addresses.0.email_address"}
on."user.updated".email = {set = "body:data.email_addresses.0.email_address"}
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The module's deployment (each test uses records of its own)."""
    with sender_deployment(
        redis_url, tmp_path_factory.mktemp("billing"), SOURCES, SECRETS
    ) as running:
        yield running


def _id(prefix: str) -> str:
    return f"{prefix}_01h{uuid.uuid4().hex[:23]}"


# -- Paddle -------------------------------------------------------------------------------


def _paddle(
    payload: dict[str, object], at: int | None = None, secret: str = PADDLE_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A Paddle notification signed with paddle_billing's PaddleSignature.calculate_hmac:
    ``Paddle-Signature: ts=<s>;h1=<hex HMAC-SHA256 of "<ts>:<body>">``."""
    body = json.dumps(payload).encode()
    ts = at or int(time.time())
    h1 = PaddleSignature.calculate_hmac(secret, f"{ts}:".encode() + body).hexdigest()
    return body, {"Paddle-Signature": f"ts={ts};h1={h1}"}


def _paddle_event(kind: str, customer: str, data: dict[str, object]) -> dict[str, object]:
    return {
        "event_id": _id("evt"),
        "event_type": kind,
        "occurred_at": "2024-04-12T10:18:49.621022Z",
        "notification_id": _id("ntf"),
        "data": {"customer_id": customer, **data},
    }


class _PaddleRequest:
    """What paddle_billing's Verifier reads of a request."""

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body = body
        self.headers = headers


def test_paddle_notifications_signed_with_the_paddle_sdk(stack: Stack) -> None:
    customer, transaction = _id("ctm"), _id("txn")
    paid = _paddle_event(
        "transaction.completed", customer, {"id": transaction, "status": "completed"}
    )
    body, headers = _paddle(paid)
    # (what keylane is sent is what Paddle's own verifier takes)
    assert Verifier().verify(_PaddleRequest(body, headers), Secret(PADDLE_SECRET))
    assert send(stack, "paddle", body, headers).status_code == 202
    # Paddle retries a notification with the same body, signed at the time of the retry
    assert replayed(send(stack, "paddle", *_paddle(paid, at=int(time.time()) + 30)))
    updated = _paddle_event(
        "subscription.updated", customer, {"id": _id("sub"), "status": "active"}
    )
    assert send(stack, "paddle", *_paddle(updated)).status_code == 202
    applied(stack, f"customer:{customer}", {"paid": [transaction], "status": "active"})
    # During a secret rotation Paddle sends one h1 per secret: either may be keylane's
    rotated = _paddle_event(
        "subscription.updated", customer, {"id": _id("sub"), "status": "past_due"}
    )
    body, headers = _paddle(rotated)
    _, old = _paddle(rotated, secret="pdl_ntfset_previous")
    ts, h1 = headers["Paddle-Signature"].split(";")
    rotating = {"Paddle-Signature": f"{ts};{old['Paddle-Signature'].split(';')[1]};{h1}"}
    assert send(stack, "paddle", body, rotating).status_code == 202
    applied(stack, f"customer:{customer}", {"paid": [transaction], "status": "past_due"})
    forged = _paddle_event("subscription.updated", customer, {"status": "canceled"})
    body, headers = _paddle(forged)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "paddle", *_paddle(forged, secret="pdl_guess")),
            "tampered": lambda: send(
                stack, "paddle", body.replace(b"canceled", b"active"), headers
            ),
            "stale": lambda: send(stack, "paddle", *_paddle(forged, at=int(time.time()) - 600)),
            "no signature": lambda: send(stack, "paddle", body, {}),
        },
    )


# -- Stripe -------------------------------------------------------------------------------


def _stripe(
    payload: dict[str, object], at: int | None = None, secret: str = STRIPE_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A Stripe event signed by stripe's WebhookSignature.generate_signature_header."""
    body = json.dumps(payload)
    header = stripe.WebhookSignature.generate_signature_header(body, secret, timestamp=at)
    return body.encode(), {"Stripe-Signature": header}


def test_stripe_invoices_signed_by_the_stripe_sdk(stack: Stack) -> None:
    customer = _id("cus")
    invoice = {
        "id": _id("evt"),
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1686089970,
        "type": "invoice.paid",
        "livemode": False,
        "pending_webhooks": 1,
        "data": {
            "object": {
                "id": _id("in"),
                "object": "invoice",
                "customer": customer,
                "amount_paid": 1200,
            }
        },
    }
    assert send(stack, "stripe", *_stripe(invoice)).status_code == 202
    # Stripe's retry: the same event, signed anew with the time of the attempt
    assert replayed(send(stack, "stripe", *_stripe(invoice, at=int(time.time()) + 60)))
    applied(stack, f"customer:{customer}", {"paid_cents": 1200})
    # (tests/test_real_senders.py refuses every other kind of forgery)
    body, headers = _stripe(invoice)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "stripe", *_stripe(invoice, secret="whsec_guess")),
            "tampered": lambda: send(stack, "stripe", body.replace(b"1200", b"99999"), headers),
        },
    )


# -- Svix ---------------------------------------------------------------------------------


def _svix(
    msg_id: str, payload: dict[str, object], at: datetime | None = None, secret: str = SVIX_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A message as a Svix-based sender (Clerk, Resend, ...) sends it: signed by the svix
    SDK's Webhook.sign, with Svix's own header names."""
    body = json.dumps(payload)
    at = at or datetime.now(UTC)
    return body.encode(), {
        "svix-id": msg_id,
        "svix-timestamp": str(int(at.timestamp())),
        "svix-signature": SvixWebhook(secret).sign(msg_id, at, body),
    }


def _clerk_user(kind: str, user: str, email: str) -> dict[str, object]:
    return {
        "type": kind,
        "object": "event",
        "data": {
            "id": user,
            "object": "user",
            "email_addresses": [{"email_address": email, "id": "idn_29w83yL7CwVlJXylYLxcslromF1"}],
            "first_name": "Ann",
        },
        "timestamp": 1654012591835,
    }


def test_svix_headers_signed_by_the_svix_sdk(stack: Stack) -> None:
    user = "user_" + uuid.uuid4().hex[:24]
    created = _clerk_user("user.created", user, "ann@example.com")
    updated = _clerk_user("user.updated", user, "ann@new.example.com")
    first_id, second_id = "msg_" + uuid.uuid4().hex[:27], "msg_" + uuid.uuid4().hex[:27]
    body, headers = _svix(first_id, created)
    # (what keylane is sent is what the svix SDK itself verifies)
    SvixWebhook(SVIX_SECRET).verify(body, headers)  # raises if not
    assert send(stack, "svix", body, headers).status_code == 202
    assert send(stack, "svix", *_svix(second_id, updated)).status_code == 202
    # Svix's retry: the same svix-id and body, a new timestamp and signature
    later = datetime.now(UTC) + timedelta(seconds=5)
    retry = send(stack, "svix", *_svix(first_id, created, at=later))
    assert replayed(retry), retry.text
    applied(stack, f"user:{user}", {"email": "ann@new.example.com"})
    other = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()
    forged = _clerk_user("user.updated", user, "eve@example.com")
    body, headers = _svix("msg_forged", forged)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "svix", *_svix("msg_forged", forged, secret=other)),
            "tampered": lambda: send(stack, "svix", body.replace(b"eve@", b"ann@"), headers),
            "another id": lambda: send(stack, "svix", body, {**headers, "svix-id": "msg_other"}),
            "stale": lambda: send(
                stack,
                "svix",
                *_svix("msg_forged", forged, at=datetime.now(UTC) - timedelta(minutes=10)),
            ),
            "no signature": lambda: send(stack, "svix", body, {}),
        },
    )
