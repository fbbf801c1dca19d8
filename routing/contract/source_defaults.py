"""What a source's signature scheme says when its table does not: the preset's defaults."""

from __future__ import annotations

from .presets import preset_named
from .signing import HmacConfig


def scheme_name(verify: object) -> str:
    """The name of a parsed ``verify`` table's scheme."""
    return str(getattr(verify, "scheme", ""))


def carries_id(verify: object) -> bool:
    """Whether a scheme's headers carry the sender's event id (``event_id = "signature"``)."""
    if isinstance(verify, HmacConfig):
        return verify.event_id_header is not None
    preset = preset_named(scheme_name(verify))
    return preset is not None and preset.event_id == "signature"


def default_event_id(verify: object) -> str:
    """Where a source's event id lives when its table does not say: where its preset
    puts it (``signature``: Standard Webhooks' ``webhook-id``, GitHub's
    ``X-GitHub-Delivery``, Shopify's ``X-Shopify-Webhook-Id``; Stripe's body ``id``, ...),
    an ``hmac`` scheme's ``event_id_header``, else the body's ``id`` (keylane's
    envelope). ``verify`` is the table or the parsed configuration."""
    if isinstance(verify, dict):
        scheme = verify.get("scheme")
        hmac_id = scheme == "hmac" and verify.get("event_id_header")
    else:
        scheme = getattr(verify, "scheme", None)
        hmac_id = isinstance(verify, HmacConfig) and verify.event_id_header
    if hmac_id:
        return "signature"
    preset = preset_named(str(scheme))
    return preset.event_id if preset is not None else "body:id"
