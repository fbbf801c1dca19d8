"""Each sender's signature, made as that sender makes it: by its own SDK where one is on
PyPI (``stripe``, ``standardwebhooks``, ``twilio``, ``slack-sdk``, ``hubspot-api-client``,
``paddle-python-sdk``), else by the recipe on its own page (named beside each). For the
tests of the senders' presets and of the worked examples in ops/docs/senders.md.

A signer takes the secret, the request as the sender sends it (method, the URL it calls,
its headers so far, its body) and the time, and gives back the headers it adds.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlsplit

import stripe
from hubspot.utils.signature import Signature as HubSpotSignature
from paddle_billing.Notifications import PaddleSignature
from slack_sdk.signature import SignatureVerifier as SlackSignatures
from standardwebhooks.webhooks import Webhook
from twilio.request_validator import RequestValidator


@dataclass(frozen=True)
class Outgoing:
    """A request as its sender builds it, before it signs it."""

    body: bytes
    url: str = "https://hooks.example.com/webhooks/x"
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def form(self) -> dict[str, str]:
        """Its body's form fields (the last of a repeated one)."""
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))


Signer = Callable[[str, Outgoing, int], dict[str, str]]


def _hmac(key: bytes, message: bytes, algorithm: str = "sha256") -> bytes:
    return hmac.new(key, message, algorithm).digest()


def _hex(key: bytes, message: bytes, algorithm: str = "sha256") -> str:
    return _hmac(key, message, algorithm).hex()


def _b64(key: bytes, message: bytes) -> str:
    return base64.b64encode(_hmac(key, message)).decode()


# -- senders with an SDK that signs ---------------------------------------------------


def stripe_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(out.body.decode(), secret, at)
    return {"Stripe-Signature": header}


def standard_webhooks_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    msg_id = out.headers.get("webhook-id", "msg_1")
    signed_at = datetime.fromtimestamp(at, tz=UTC)
    signature = Webhook(secret).sign(msg_id, signed_at, out.body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(at), "webhook-signature": signature}


def twilio_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    return {"X-Twilio-Signature": RequestValidator(secret).compute_signature(out.url, out.form)}


def slack_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    signature = SlackSignatures(secret).generate_signature(timestamp=str(at), body=out.body)
    assert signature is not None
    return {"X-Slack-Request-Timestamp": str(at), "X-Slack-Signature": signature}


def hubspot_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    at_ms = str(at * 1000)
    signature = HubSpotSignature.get_signature(
        secret, out.body.decode(), "v3", http_uri=out.url, http_method=out.method, timestamp=at_ms
    )
    return {"X-HubSpot-Request-Timestamp": at_ms, "X-HubSpot-Signature-v3": signature}


def paddle_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    h1 = PaddleSignature.calculate_hmac(secret, f"{at}:".encode() + out.body).hexdigest()
    return {"Paddle-Signature": f"ts={at};h1={h1}"}


# -- senders signed by their documented recipe -----------------------------------------


def github_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # docs.github.com, "Validating webhook deliveries"
    return {"X-Hub-Signature-256": "sha256=" + _hex(secret.encode(), out.body)}


def shopify_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # shopify.dev, "Verify a webhook": base64 HMAC-SHA256 of the body
    return {"X-Shopify-Hmac-Sha256": _b64(secret.encode(), out.body)}


def calendly_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developer.calendly.com, "Webhook signatures": t=,v1= over "<t>.<body>"
    v1 = _hex(secret.encode(), f"{at}.".encode() + out.body)
    return {"Calendly-Webhook-Signature": f"t={at},v1={v1}"}


def zoom_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developers.zoom.us, "Verify webhook events": v0= over "v0:<ts>:<body>"
    v0 = _hex(secret.encode(), f"v0:{at}:".encode() + out.body)
    return {"x-zm-request-timestamp": str(at), "x-zm-signature": f"v0={v0}"}


def meta_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # Graph API webhooks: X-Hub-Signature-256 over the body, keyed with the app secret
    return {"X-Hub-Signature-256": "sha256=" + _hex(secret.encode(), out.body)}


def intercom_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developers.intercom.com: X-Hub-Signature, sha1= and the hex HMAC-SHA1 of the body
    return {"X-Hub-Signature": "sha1=" + _hex(secret.encode(), out.body, "sha1")}


def typeform_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # Typeform "Secure your webhooks": sha256= and the base64 HMAC-SHA256 of the body
    return {"Typeform-Signature": "sha256=" + _b64(secret.encode(), out.body)}


def asana_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developers.asana.com webhooks guide: X-Hook-Signature, hex HMAC-SHA256 of the body
    return {"X-Hook-Signature": _hex(secret.encode(), out.body)}


def close_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developer.close.com webhooks: the HMAC of timestamp + payload, the key hex-decoded
    signature = _hex(bytes.fromhex(secret), str(at).encode() + out.body)
    return {"close-sig-hash": signature, "close-sig-timestamp": str(at)}


def attio_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # docs.attio.com webhooks: hex HMAC-SHA256 of the body, in both headers
    signature = _hex(secret.encode(), out.body)
    return {"Attio-Signature": signature, "X-Attio-Signature": signature}


def zendesk_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developer.zendesk.com "Verifying": base64(HMACSHA256(TIMESTAMP + BODY))
    stamp = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "X-Zendesk-Webhook-Signature": _b64(secret.encode(), stamp.encode() + out.body),
        "X-Zendesk-Webhook-Signature-Timestamp": stamp,
    }


def square_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # squareup's webhooks_helper: base64 HMAC-SHA256 of the notification URL + body
    return {"x-square-hmacsha256-signature": _b64(secret.encode(), out.url.encode() + out.body)}


def tally_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # tally.so/help/webhooks: base64 HMAC-SHA256 of the body
    return {"Tally-Signature": _b64(secret.encode(), out.body)}


def formstack_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # Formstack's HMAC key: sha256= and the hex HMAC-SHA256 of the body as sent
    return {"X-FS-Signature": "sha256=" + _hex(secret.encode(), out.body)}


def calcom_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # cal.com sendPayload.ts: hex HMAC-SHA256 of the body
    return {"X-Cal-Signature-256": _hex(secret.encode(), out.body)}


def webflow_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developers.webflow.com "Verifying Requests": "<ms timestamp>:<body>", hex
    at_ms = str(at * 1000)
    return {
        "x-webflow-timestamp": at_ms,
        "x-webflow-signature": _hex(secret.encode(), f"{at_ms}:".encode() + out.body),
    }


def airtable_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # pyairtable WebhookNotification.from_request: the macSecretBase64 decoded is the key
    return {"X-Airtable-Content-MAC": "hmac-sha256=" + _hex(base64.b64decode(secret), out.body)}


def notion_signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    # developers.notion.com webhooks, step 3: sha256= and the hex HMAC-SHA256 of the body,
    # keyed with the verification_token
    return {"X-Notion-Signature": "sha256=" + _hex(secret.encode(), out.body)}


def token_in_header(name: str) -> Signer:
    """A sender that sends a shared token in header ``name``."""

    def signs(secret: str, out: Outgoing, at: int) -> dict[str, str]:
        return {name: secret}

    return signs


def basic_credentials(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    """HTTP Basic (``secret`` is ``user:password``)."""
    return {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}


def unsigned(secret: str, out: Outgoing, at: int) -> dict[str, str]:
    """A sender whose proof is in the URL or the body (Jotform, Mailchimp, Salesforce,
    Graph): nothing to add."""
    return {}


SIGNERS: dict[str, Signer] = {
    "stripe": stripe_signs,
    "standard_webhooks": standard_webhooks_signs,
    "twilio": twilio_signs,
    "slack": slack_signs,
    "hubspot": hubspot_signs,
    "paddle": paddle_signs,
    "github": github_signs,
    "shopify": shopify_signs,
    "calendly": calendly_signs,
    "zoom": zoom_signs,
    "meta": meta_signs,
    "intercom": intercom_signs,
    "typeform": typeform_signs,
    "asana": asana_signs,
    "close": close_signs,
    "attio": attio_signs,
    "zendesk": zendesk_signs,
    "square": square_signs,
    "tally": tally_signs,
    "formstack": formstack_signs,
    "calcom": calcom_signs,
    "webflow": webflow_signs,
    "airtable": airtable_signs,
    "notion": notion_signs,
    "pipedrive": basic_credentials,
    "basic": basic_credentials,
}


def url_of(public_url: str, path: str, query: str = "") -> str:
    """The URL a sender calls: the public base, the path and the query."""
    base = public_url.rstrip("/") + path
    return f"{base}?{query}" if query else base


def path_and_query(url: str) -> str:
    """The request target of ``url`` (its path and query)."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")
