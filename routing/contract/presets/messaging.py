"""Messaging and workspace senders: Twilio, Slack, Zoom, Meta (Lead Ads, WhatsApp,
Messenger), Asana, Microsoft Graph."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

MESSAGING = (
    Preset(
        name="twilio",
        title="Twilio (SMS, voice)",
        # X-Twilio-Signature: base64 HMAC-SHA1 (HMAC-SHA256 when it says so) of the URL
        # Twilio called and the form's parameters sorted by name.
        check="twilio",
        body="form",
        # The same token on Twilio's retry of a request; a request without one is retried
        # byte for byte (its parameters are what Twilio signs), so its body is its id.
        event_id="header:I-Twilio-Idempotency-Token",
        missing_id="content-hash",
        event_type=None,
        reply="twiml",
        retention_s=DAY_S,  # Twilio retries within seconds (connection overrides: 5 at most)
        docs="https://www.twilio.com/docs/usage/webhooks/webhooks-security",
    ),
    Preset(
        name="slack",
        title="Slack (Events API, interactivity)",
        check="hmac",
        layout=SignatureLayout(
            header="x-slack-signature",
            prefix="v0=",
            timestamp_header="x-slack-request-timestamp",
            signed_payload="v0:{timestamp}:{body}",
        ),
        json_fields=("payload",),  # interactivity posts a form whose payload is JSON
        event_id="body:event_id",
        event_type="body:event.type",
        handshake="slack",
        retention_s=DAY_S,  # 3 retries: at once, after 1 and after 5 minutes
        docs="https://api.slack.com/authentication/verifying-requests-from-slack",
    ),
    Preset(
        name="zoom",
        title="Zoom",
        check="hmac",
        layout=SignatureLayout(
            header="x-zm-signature",
            prefix="v0=",
            timestamp_header="x-zm-request-timestamp",
            signed_payload="v0:{timestamp}:{body}",
        ),
        # No event id: a retry sends the same event (its event_ts is the event's time).
        event_id="content-hash",
        event_type="body:event",
        handshake="zoom",
        retention_s=DAY_S,  # 3 retries over about 85 minutes
        docs="https://developers.zoom.us/docs/api/webhooks/",
    ),
    Preset(
        name="meta",
        title="Meta (Lead Ads, WhatsApp, Messenger)",
        check="hmac",
        layout=SignatureLayout(header="x-hub-signature-256", prefix="sha256="),
        options=frozenset({"verify_token_env"}),
        # Up to 1,000 changes in one delivery, re-batched on retry: each is an event.
        items="body:entry.*.changes.*",
        event_id="content-hash",  # no id; a change's content is its id
        event_type="body:field",  # leadgen, messages, ...
        handshake="meta",
        retention_s=8 * DAY_S,  # Graph: 36 hours; WhatsApp: up to 7 days
        docs="https://developers.facebook.com/docs/graph-api/webhooks/getting-started",
    ),
    Preset(
        name="asana",
        title="Asana",
        # The secret comes in the handshake (X-Hook-Secret) and is kept in Redis; later
        # deliveries are signed with it (X-Hook-Signature: hex HMAC-SHA256 of the body).
        check="hmac",
        layout=SignatureLayout(header="x-hook-signature"),
        needs_secrets=False,
        # Its events are JSON; its handshake has no body and no media type at all.
        body="json",
        items="body:events.*",
        event_id="content-hash",  # no id
        event_type="{body:resource.resource_type}.{body:action}",
        handshake="asana",
        retention_s=2 * DAY_S,  # retried for up to 24 hours
        docs="https://developers.asana.com/docs/webhooks-guide",
    ),
    Preset(
        name="microsoft_graph",
        title="Microsoft Graph change notifications",
        # No signature: every notification carries the clientState given at subscription.
        check="graph",
        # Notifications are JSON; the validation POST says text/plain (and has no body).
        body="json",
        items="body:value.*",
        event_id="body:id",
        missing_id="content-hash",
        event_type="body:changeType",
        handshake="graph",
        retention_s=DAY_S,  # retried for up to 4 hours
        docs="https://learn.microsoft.com/graph/change-notifications-delivery-webhooks",
    ),
)
