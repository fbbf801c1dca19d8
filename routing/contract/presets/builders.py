"""Form, scheduling, site and workspace builders beyond the first fifteen: Tally,
Formstack, Cal.com, Webflow, Airtable, Notion. Each entry says where its facts come from."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

BUILDERS = (
    Preset(
        name="tally",
        title="Tally",
        check="hmac",
        # Tally-Signature: base64 HMAC-SHA256 of the body, keyed with the webhook's signing
        # secret; no prefix, no timestamp (tally.so/help/webhooks; the signing secret is
        # optional there: set one).
        layout=SignatureLayout(header="tally-signature", encoding="base64"),
        event_id="body:eventId",
        event_type="body:eventType",  # FORM_RESPONSE
        # "retried up to 5 times ... (5 minutes, 30 minutes, 1 hour, 6 hours, 24 hours)"
        # (developers.tally.so, retry webhook event): about 32 hours.
        retention_s=2 * DAY_S,
        docs="https://tally.so/help/webhooks",
    ),
    Preset(
        name="formstack",
        title="Formstack Forms",
        check="hmac",
        # X-FS-Signature: sha256= and the hex HMAC-SHA256 of the body as sent (a form by
        # default, JSON when the webhook says so), keyed with the webhook's HMAC key; no
        # timestamp. (Formstack's own pages name the HMAC key, hmacSecret; the header's
        # layout is from Hookdeck's notes, checked there against two real deliveries.)
        layout=SignatureLayout(header="x-fs-signature", prefix="sha256="),
        event_id="body:UniqueID",  # the submission's id
        event_type=None,  # a submission; FormID says which form
        retention_s=3 * DAY_S,  # Formstack does not say how it retries
        docs="https://developers.formstack.com/docs/webhook-setup",
    ),
    Preset(
        name="calcom",
        title="Cal.com",
        check="hmac",
        # X-Cal-Signature-256: hex HMAC-SHA256 of the body, keyed with the webhook's
        # secret (cal.com's sendPayload.ts); a webhook without a secret sends the text
        # "no-secret-provided", which is no signature and fails the check.
        layout=SignatureLayout(header="x-cal-signature-256"),
        # No event id. A body is {triggerEvent, createdAt, payload} and a retry sends it
        # again as it was: the body is the id (a booking's next trigger is another body).
        event_id="content-hash",
        event_type="body:triggerEvent",  # BOOKING_CREATED, BOOKING_CANCELLED, ...
        retention_s=DAY_S,  # 3 attempts, back-off of 30 s to 10 min (its delivery task)
        docs="https://cal.com/docs/developing/guides/automation/webhooks",
    ),
    Preset(
        name="webflow",
        title="Webflow",
        check="hmac",
        # x-webflow-signature: hex HMAC-SHA256 of "<x-webflow-timestamp>:<body>", the
        # timestamp in milliseconds, keyed with the OAuth app's client secret (or the
        # webhook's own secret); older than 5 minutes is refused (Webflow's "Verifying
        # Requests"). Webhooks made in the site's dashboard are not signed: make them
        # through the API.
        layout=SignatureLayout(
            header="x-webflow-signature",
            timestamp_header="x-webflow-timestamp",
            timestamp_unit="ms",
            signed_payload="{timestamp}:{body}",
        ),
        # No event id: a form submission or CMS item carries its own ids and times, and a
        # retry the same body.
        event_id="content-hash",
        event_type="body:triggerType",  # form_submission, collection_item_changed, ...
        retention_s=DAY_S,  # 3 retries, 10 minutes apart ("Limits and Retries")
        docs="https://developers.webflow.com/data/docs/working-with-webhooks",
    ),
    Preset(
        name="airtable",
        title="Airtable",
        check="hmac",
        # X-Airtable-Content-MAC: hmac-sha256= and the hex HMAC-SHA256 of the body, keyed
        # with the webhook's macSecretBase64 base64-decoded (pyairtable's
        # WebhookNotification.from_request).
        layout=SignatureLayout(
            header="x-airtable-content-mac", prefix="hmac-sha256=", key="base64"
        ),
        # A notification carries no change, only which base and webhook to fetch payloads
        # for, and when: the body is its id.
        event_id="content-hash",
        event_type=None,
        retention_s=DAY_S,
        docs="https://airtable.com/developers/web/api/webhooks-overview",
    ),
    Preset(
        name="notion",
        title="Notion",
        check="hmac",
        # X-Notion-Signature: sha256= and the hex HMAC-SHA256 of the body, keyed with the
        # subscription's verification_token, which Notion sends once, unsigned, when the
        # subscription is made (developers.notion.com/reference/webhooks, steps 2 and 3):
        # kept by the receiver as Asana's secret is, unless secrets_env names it.
        layout=SignatureLayout(header="x-notion-signature", prefix="sha256="),
        needs_secrets=False,
        handshake="notion",
        event_id="body:id",  # "Unique identifier for this webhook event"
        event_type="body:type",  # page.created, page.content_updated, comment.created, ...
        # attempt_number: "The delivery attempt number (1-8) of the current event
        # delivery", raised by each retry (its webhook event reference).
        digest_excludes=("attempt_number",),
        retention_s=2 * DAY_S,  # 8 attempts (their schedule was not read)
        docs="https://developers.notion.com/reference/webhooks",
    ),
)
