"""Shopify: ``X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256 of the body>``.

The key is the app's client secret as UTF-8. There is no timestamp; the id of the
delivery is in ``X-Shopify-Webhook-Id``, which is not signed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .generic import HmacSpec, HmacVerifier
from .signing_keys import SecretInput

SHOPIFY = HmacSpec(
    header="x-shopify-hmac-sha256",
    algorithm="sha256",
    encoding="base64",
    event_id_header="x-shopify-webhook-id",
)


def shopify_verifier(secrets: Sequence[SecretInput]) -> HmacVerifier:
    """A verifier of Shopify's ``X-Shopify-Hmac-Sha256`` holding ``secrets``."""
    return HmacVerifier("shopify", secrets, SHOPIFY)
