"""CRM, support, work and payment senders beyond the first fifteen: Close, Attio, Zendesk,
monday.com, Square. Each entry says where its facts come from (the provider's page, or its
SDK)."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

SALES = (
    Preset(
        name="close",
        title="Close",
        check="hmac",
        # close-sig-hash: hex HMAC-SHA256 of close-sig-timestamp (Unix seconds) and the body
        # concatenated, keyed with the subscription's signature_key hex-decoded (Close's own
        # example: hmac.new(bytearray.fromhex(key), ...)). Close states no tolerance; each
        # POST carries the time it was signed, so the default 5 minutes applies.
        layout=SignatureLayout(
            header="close-sig-hash",
            timestamp_header="close-sig-timestamp",
            signed_payload="{timestamp}{body}",
            key="hex",
        ),
        event_id="body:event.id",  # ev_...: one per Event Log entry
        event_type="{body:event.object_type}.{body:event.action}",  # opportunity.updated
        retention_s=4 * DAY_S,  # "retried up to 72 hours before being dropped"
        docs="https://developer.close.com/api/resources/webhooks",
    ),
    Preset(
        name="attio",
        title="Attio",
        check="hmac",
        # Attio-Signature (and the same in X-Attio-Signature): hex HMAC-SHA256 of the body,
        # keyed with the webhook's secret; no timestamp (Attio's webhooks guide).
        layout=SignatureLayout(header="attio-signature"),
        # {"webhook_id": ..., "events": [...]}: each event an item. The Idempotency-Key
        # header is "different for each message, but the same between retries and
        # redeliveries": with the item's place in the message, each event's id. (An
        # event carries ids only; two alike in different messages are two changes.)
        items="body:events.*",
        event_id="{header:Idempotency-Key}:{item:index}",
        event_type="body:event_type",  # record.updated, note.created, ...
        retention_s=4 * DAY_S,  # up to 10 retries "over approximately 3 days"
        docs="https://docs.attio.com/rest-api/how-to/webhooks",
    ),
    Preset(
        name="zendesk",
        title="Zendesk",
        check="hmac",
        # X-Zendesk-Webhook-Signature: base64 HMAC-SHA256 of the
        # X-Zendesk-Webhook-Signature-Timestamp header (ISO 8601, 2021-07-25T10:00:00Z)
        # followed by the body, keyed with the webhook's signing secret as text (Zendesk's
        # "Verifying webhook authenticity": base64(HMACSHA256(TIMESTAMP + BODY))).
        layout=SignatureLayout(
            header="x-zendesk-webhook-signature",
            encoding="base64",
            timestamp_header="x-zendesk-webhook-signature-timestamp",
            timestamp_unit="iso",
            signed_payload="{timestamp}{body}",
        ),
        # Event subscriptions carry an event id ("id") and type ("type":
        # zen:event-type:user.created); a trigger's or automation's webhook is the body its
        # author wrote, with no id: the body is the id (a retry sends the same body).
        event_id="body:id",
        missing_id="content-hash",
        event_type="body:type",
        # Zendesk retries "certain HTTP response codes" within minutes (its page's details
        # were not read): 2 days.
        retention_s=2 * DAY_S,
        docs="https://developer.zendesk.com/documentation/webhooks/verifying/",
    ),
    Preset(
        name="monday",
        title="monday.com board webhooks",
        # A board webhook made in monday's Integrations Center signs nothing (one made by an
        # app through the API carries a JWT, which this preset does not check): a token in
        # the URL given to monday is the proof (?key=...).
        check="token",
        sent_in="query:key",
        # When the URL is given, monday POSTs {"challenge": ...} and wants the same JSON
        # back (developer.monday.com, webhooks, "URL Verification").
        handshake="monday",
        # Events are {"event": {...}}; no id monday says is kept on a retry: a retry sends
        # the same event (changedAt, triggerTime in it), so the body is the id.
        event_id="content-hash",
        event_type="body:event.type",  # create_pulse, update_column_value, ...
        retention_s=DAY_S,  # "retried once per minute for 30 minutes"
        docs="https://developer.monday.com/api-reference/docs/webhooks",
    ),
    Preset(
        name="square",
        title="Square",
        check="hmac",
        # x-square-hmacsha256-signature: base64 HMAC-SHA256 of the notification URL (as the
        # subscription has it: KEYLANE_PUBLIC_URL and the path) followed by the body, keyed
        # with the subscription's signature key (squareup's webhooks_helper.verify_signature).
        layout=SignatureLayout(
            header="x-square-hmacsha256-signature",
            encoding="base64",
            signed_payload="{url}{body}",
        ),
        # "Webhooks can be sent more than once": event_id is the same on each, with
        # square-retry-number and -reason headers added to a retry.
        event_id="body:event_id",
        event_type="body:type",  # payment.created, customer.updated, ...
        # Retried with back-off for 24 hours (one version of Square's troubleshooting page
        # says 72): 4 days.
        retention_s=4 * DAY_S,
        docs="https://developer.squareup.com/docs/webhooks-overview",
    ),
)
