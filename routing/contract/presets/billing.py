"""Billing senders: Stripe and Paddle."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

BILLING = (
    Preset(
        name="stripe",
        title="Stripe",
        check="hmac",
        # Stripe-Signature: t=<s>,v1=<hex>[,v1=<hex>] (one v1 per live secret while one is
        # rolled), v1 the HMAC-SHA256 of "<t>.<body>" keyed with the whsec_ secret as text.
        layout=SignatureLayout(
            header="stripe-signature", pairs=",", signed_payload="{timestamp}.{body}"
        ),
        event_id="body:id",
        retention_s=3 * DAY_S,  # live mode retries for up to 3 days
        docs="https://docs.stripe.com/webhooks",
    ),
    Preset(
        name="paddle",
        title="Paddle Billing",
        check="hmac",
        # Paddle-Signature: ts=<s>;h1=<hex>[;h1=<hex>], h1 the HMAC-SHA256 of "<ts>:<body>".
        layout=SignatureLayout(
            header="paddle-signature",
            pairs=";",
            timestamp_key="ts",
            signature_key="h1",
            signed_payload="{timestamp}:{body}",
        ),
        event_id="body:event_id",  # evt_...; the same on each of a notification's retries
        event_type="body:event_type",
        retention_s=4 * DAY_S,  # live: up to 60 retries over 3 days
        docs="https://developer.paddle.com/webhooks/signature-verification",
    ),
)
