"""From a source's signature configuration to its verifier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import assert_never

from ...routing.contract.errors import ConfigError
from ...routing.contract.signing import (
    GithubConfig,
    HmacConfig,
    NoneConfig,
    ShopifyConfig,
    StandardWebhooksConfig,
    StripeConfig,
    VerifyConfig,
    load_secrets,
)
from ...routing.contract.sources import Sources
from .generic import HmacSpec, HmacVerifier
from .github import github_verifier
from .shopify import shopify_verifier
from .signing_keys import SecretInput
from .standard_webhooks import StandardWebhooksVerifier
from .stripe import StripeVerifier
from .unsigned import UnsignedVerifier
from .verifier import Verifier


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
        return HmacVerifier("hmac", secrets, HmacSpec.of(config))
    assert_never(config)


def verifiers_of(sources: Sources, environ: Mapping[str, str]) -> dict[str, Verifier]:
    """Each source's verifier, with secrets read from ``environ`` (at start-up: a missing
    secret is a ConfigError naming the variable, never its value)."""
    return {s.name: verifier_from_environ(s.verify, environ) for s in sources.all()}


def verifier_from_environ(config: VerifyConfig, environ: Mapping[str, str]) -> Verifier:
    """The verifier ``config`` describes, with its secrets read from ``environ``."""
    return build_verifier(config, load_secrets(config, environ))
