"""Schemes that are not one provider: a shared token, HTTP Basic credentials, the
Standard Webhooks specification (Svix and the senders built on it), and the two
code-hosting senders keylane started with (GitHub, Shopify)."""

from __future__ import annotations

from .model import DAY_S, Preset, SignatureLayout

GENERIC = (
    Preset(
        name="token",
        title="A shared token (any sender)",
        check="token",
        event_id="body:id",
        retention_s=3 * DAY_S,
        docs="https://www.rfc-editor.org/rfc/rfc6750",
    ),
    Preset(
        name="basic",
        title="HTTP Basic credentials (any sender)",
        check="basic",
        event_id="body:id",
        retention_s=3 * DAY_S,
        docs="https://www.rfc-editor.org/rfc/rfc7617",
    ),
    Preset(
        name="standard_webhooks",
        title="Standard Webhooks, Svix",
        check="standard_webhooks",
        event_id="signature",
        # Svix retries for about 28 hours (immediately, 5 s, 5 min, 30 min, 2 h, 5 h,
        # 10 h, 10 h); the specification's example schedule runs to about 76 hours.
        retention_s=2 * DAY_S,
        docs="https://www.standardwebhooks.com/",
    ),
    Preset(
        name="github",
        title="GitHub",
        check="hmac",
        layout=SignatureLayout(
            header="x-hub-signature-256", prefix="sha256=", event_id_header="x-github-delivery"
        ),
        event_id="signature",
        event_type="header:X-GitHub-Event",
        # GitHub never retries by itself; a person may redeliver for 3 days.
        retention_s=3 * DAY_S,
        docs="https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries",
    ),
    Preset(
        name="shopify",
        title="Shopify",
        check="hmac",
        layout=SignatureLayout(
            header="x-shopify-hmac-sha256",
            encoding="base64",
            event_id_header="x-shopify-webhook-id",
        ),
        event_id="signature",
        event_type="header:X-Shopify-Topic",
        retention_s=3 * DAY_S,  # retried 8 times over 4 hours; kept 3 days as before
        docs="https://shopify.dev/docs/apps/build/webhooks/subscribe/https",
    ),
)
