"""From a source's signature configuration to its verifier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import assert_never

from producers.signatures.base import Verifier
from producers.signatures.config import (
    GithubConfig,
    HmacConfig,
    NoneConfig,
    ShopifyConfig,
    StandardWebhooksConfig,
    StripeConfig,
    VerifyConfig,
    load_secrets,
)
from producers.signatures.generic import HmacVerifier
from producers.signatures.github import github_verifier
from producers.signatures.keys import SecretInput
from producers.signatures.shopify import shopify_verifier
from producers.signatures.standard_webhooks import StandardWebhooksVerifier
from producers.signatures.stripe import StripeVerifier
from producers.signatures.unsigned import UnsignedVerifier
from workers.errors import ConfigError


def build_verifier(config: VerifyConfig, secrets: Sequence[SecretInput]) -> Verifier:
    """The verifier ``config`` describes, holding ``secrets`` (any of which may sign).

    Raises ``ConfigError`` if a signed scheme gets no secret, a secret is empty or cannot
    be decoded, or the ``none`` scheme is given secrets.
    """
    if isinstance(config, NoneConfig):
        if secrets:
            raise ConfigError("the none signature scheme takes no secrets")
        return UnsignedVerifier()
    if isinstance(config, StandardWebhooksConfig):
        return StandardWebhooksVerifier(secrets, config.tolerance_s)
    if isinstance(config, StripeConfig):
        return StripeVerifier(secrets, config.tolerance_s)
    if isinstance(config, GithubConfig):
        return github_verifier(secrets)
    if isinstance(config, ShopifyConfig):
        return shopify_verifier(secrets)
    if isinstance(config, HmacConfig):
        return HmacVerifier("hmac", secrets, config.spec())
    assert_never(config)


def verifier_from_environ(config: VerifyConfig, environ: Mapping[str, str]) -> Verifier:
    """The verifier ``config`` describes, with its secrets read from ``environ``."""
    return build_verifier(config, load_secrets(config, environ))
