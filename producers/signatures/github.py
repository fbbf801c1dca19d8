"""GitHub: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``.

The key is the webhook secret as UTF-8. There is no timestamp, so a captured delivery can
be replayed at will; dedupe on ``X-GitHub-Delivery`` (the same id on a manual
redelivery) is what stops it having a second effect. That header is not signed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .generic import HmacSpec, HmacVerifier
from .signing_keys import SecretInput

GITHUB = HmacSpec(
    header="x-hub-signature-256",
    algorithm="sha256",
    encoding="hex",
    prefix="sha256=",
    event_id_header="x-github-delivery",
)


def github_verifier(secrets: Sequence[SecretInput]) -> HmacVerifier:
    """A verifier of GitHub's ``X-Hub-Signature-256`` holding ``secrets``."""
    return HmacVerifier("github", secrets, GITHUB)
