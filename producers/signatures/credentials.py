"""Senders that prove themselves by a shared secret instead of a signature:

* ``token``: a token in a header (``token = "header:X-Api-Key"``; ``Authorization: Bearer
  <token>`` is read without its ``Bearer``) or in the URL (``token = "query:key"``: Jotform,
  Mailchimp and any form whose webhook URL carries a secret);
* ``basic``: HTTP Basic credentials (Pipedrive), each secret holding ``user:password``.

Each is compared in constant time against every held secret (several while one is
rotated). The body is not signed: a token proves who sent it, not what it says.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence

from ...routing.contract.errors import ConfigError, SignatureError
from .signing_keys import SecretInput, SigningKeys, utf8_key
from .verifier import NO_TARGET, Target, Verified, lower_headers


class TokenVerifier:
    """Verifies a token read where ``token_at`` says (``header:<name>`` / ``query:<name>``)."""

    name: str

    def __init__(self, name: str, secrets: Sequence[SecretInput], token_at: str) -> None:
        self.name = name
        self.kind, _, where = token_at.partition(":")
        self.where = where.lower() if self.kind == "header" else where
        self._secrets = SigningKeys(name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return (
            f"TokenVerifier(name={self.name!r}, at={self.kind}:{self.where}, "
            f"keys={len(self._secrets)})"
        )

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Verified when the token is one of the held secrets."""
        if self.kind == "query":
            offered = target.query.get(self.where, "")
        else:
            offered = lower_headers(headers).get(self.where, "").strip()
            if self.where == "authorization" and offered[:7].lower() == "bearer ":
                offered = offered[7:].strip()
        if not offered:
            raise SignatureError(f"missing token ({self.kind} {self.where})")
        if not self._secrets.holds(offered.encode()):
            raise SignatureError("the token is not one of this source's")
        return Verified(scheme=self.name, event_id=None, timestamp=None)


class BasicVerifier:
    """Verifies HTTP Basic credentials against the held ``user:password`` secrets."""

    name: str

    def __init__(self, name: str, secrets: Sequence[SecretInput]) -> None:
        self.name = name
        for position, secret in enumerate(secrets, 1):
            if b":" not in utf8_key(secret):
                raise ConfigError(f"secret #{position} for the {name} scheme is not user:password")
        self._secrets = SigningKeys(name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return f"BasicVerifier(name={self.name!r}, keys={len(self._secrets)})"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Verified when the ``Authorization: Basic`` credentials are held ones."""
        value = lower_headers(headers).get("authorization", "").strip()
        if value[:6].lower() != "basic ":
            raise SignatureError("missing header authorization (HTTP Basic credentials)")
        try:
            offered = base64.b64decode(value[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError("malformed header authorization: not base64") from None
        if not self._secrets.holds(offered):
            raise SignatureError("the credentials are not this source's")
        return Verified(scheme=self.name, event_id=None, timestamp=None)
