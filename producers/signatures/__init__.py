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
    PresetConfig,
    ShopifyConfig,
    StandardWebhooksConfig,
    StripeConfig,
    VerifyConfig,
    load_secrets,
    parse_verify_config,
)
from .factory import KeptSecretVerifier, build_verifier, verifier_from_environ, verifiers_of
from .signing_keys import SecretInput
from .verifier import NO_TARGET, Target, Verified, Verifier

__all__ = [
    "NO_TARGET",
    "GithubConfig",
    "HmacConfig",
    "KeptSecretVerifier",
    "NoneConfig",
    "PresetConfig",
    "SecretInput",
    "ShopifyConfig",
    "StandardWebhooksConfig",
    "StripeConfig",
    "Target",
    "Verified",
    "Verifier",
    "VerifyConfig",
    "build_verifier",
    "load_secrets",
    "parse_verify_config",
    "verifier_from_environ",
    "verifiers_of",
]
