"""Form and scheduling senders: Typeform, Jotform, Google Forms (through Apps Script),
Mailchimp's audience webhooks, Calendly."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

FORMS = (
    Preset(
        name="typeform",
        title="Typeform",
        check="hmac",
        layout=SignatureLayout(header="typeform-signature", encoding="base64", prefix="sha256="),
        event_id="body:event_id",
        event_type="body:event_type",  # form_response, form_response_partial
        retention_s=DAY_S,  # retried for up to 10 hours
        docs="https://www.typeform.com/developers/webhooks/secure-your-webhooks/",
    ),
    Preset(
        name="jotform",
        title="Jotform",
        # No signature: a secret in the URL the form posts to (?key=...).
        check="token",
        sent_in="query:key",
        body="multipart",
        json_fields=("rawRequest",),  # the answers, as JSON text: body:rawRequest.q3_email
        event_id="body:submissionID",
        event_type=None,
        retention_s=DAY_S,
        docs="https://www.jotform.com/help/245-how-to-setup-a-webhook-with-jotform/",
    ),
    Preset(
        name="google_forms",
        title="Google Forms (Apps Script)",
        # The script sends the token in a header (UrlFetchApp's headers), or in the URL.
        check="token",
        sent_in="header:X-Keylane-Token",
        event_id="body:response_id",
        event_type=None,
        retention_s=DAY_S,  # Apps Script never retries by itself
        docs="https://developers.google.com/apps-script/reference/url-fetch/url-fetch-app",
    ),
    Preset(
        name="mailchimp",
        title="Mailchimp (audience webhooks)",
        # No signature: Mailchimp's advice is a secret in the URL, checked on every POST and
        # on the GET it sends when the webhook is created.
        check="token",
        sent_in="query:key",
        body="form",
        handshake="mailchimp",
        # No id: a retry carries the same form, so the form is the id.
        event_id="content-hash",
        retention_s=DAY_S,  # retried over 75 minutes
        docs="https://mailchimp.com/developer/marketing/guides/sync-audience-data-webhooks/",
    ),
    Preset(
        name="calendly",
        title="Calendly",
        check="hmac",
        layout=SignatureLayout(
            header="calendly-webhook-signature", pairs=",", signed_payload="{timestamp}.{body}"
        ),
        # No event id: an invitee's URI is created once and canceled once.
        event_id="{body:event}:{body:payload.uri}",
        event_type="body:event",
        retention_s=2 * DAY_S,  # retried for 24 hours
        tolerance_s=180,  # Calendly's own example checks 3 minutes
        docs="https://developer.calendly.com/api-docs/overview/webhooks/webhook-signatures",
    ),
)
