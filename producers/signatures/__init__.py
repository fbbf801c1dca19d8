"""Webhook signature verification: one verifier per scheme, built from a source's config.

Usage, at start-up::

    verifier = verifier_from_environ(parse_verify_config(table), os.environ)

and per delivery, before anything else reads the body::

    verified = verifier.verify(request.headers, body, now=time.time())  # or SignatureError
"""

from ...routing.contract.signing import (
    GithubConfig,
    HmacConfig,
    NoneConfig,
    ShopifyConfig,
    StandardWebhooksConfig,
    StripeConfig,
    VerifyConfig,
    load_secrets,
    parse_verify_config,
)
from .factory import build_verifier, verifier_from_environ, verifiers_of
from .signing_keys import SecretInput
from .verifier import Verified, Verifier

__all__ = [
    "GithubConfig",
    "HmacConfig",
    "NoneConfig",
    "SecretInput",
    "ShopifyConfig",
    "StandardWebhooksConfig",
    "StripeConfig",
    "Verified",
    "Verifier",
    "VerifyConfig",
    "build_verifier",
    "load_secrets",
    "parse_verify_config",
    "verifier_from_environ",
    "verifiers_of",
]
