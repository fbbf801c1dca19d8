"""Signing keys held out of sight, and signatures compared in constant time.

Keys live in :class:`SigningKeys` as pydantic ``SecretBytes``, so neither a verifier's
``repr`` nor a traceback's locals display them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from typing import TypeAlias

from pydantic import SecretBytes, SecretStr

from ...routing.contract.errors import ConfigError
from ...routing.contract.presets import Algorithm, Encoding, KeyForm
from ...routing.contract.signing import whsec_key

SecretInput: TypeAlias = str | bytes | SecretStr | SecretBytes

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


def reveal(secret: SecretInput) -> str | bytes:
    """The plain value of ``secret``."""
    if isinstance(secret, SecretStr | SecretBytes):
        return secret.get_secret_value()
    return secret


def utf8_key(secret: SecretInput) -> bytes:
    """``secret`` used as written: text as UTF-8, bytes as they are."""
    value = reveal(secret)
    return value.encode() if isinstance(value, str) else value


def hmac_key(secret: SecretInput, form: KeyForm, scheme: str, position: int) -> bytes:
    """The HMAC key a secret stands for (:data:`KeyForm`); bytes are the key as they are.
    ``ConfigError`` (naming the secret's position, never its text) when it cannot be
    decoded."""
    value = reveal(secret)
    if isinstance(value, bytes) or form == "utf8":
        return value if isinstance(value, bytes) else value.encode()
    try:
        if form == "whsec":
            # Lenient like the standardwebhooks package, so a secret it takes is taken here.
            return whsec_key(value)
        if form == "hex":
            return bytes.fromhex(value)
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise ConfigError(
            f"secret #{position} for the {scheme} signature is not {_FORM_NAMES[form]}"
        ) from None


_FORM_NAMES = {"whsec": "base64", "hex": "hex", "base64": "base64"}


class SigningKeys:
    """The HMAC keys a sender may have used: several while a secret is being rotated."""

    __slots__ = ("_keys",)

    def __init__(self, scheme: str, keys: Iterable[bytes]) -> None:
        held = tuple(SecretBytes(key) for key in keys)
        if not held:
            raise ConfigError(f"the {scheme} signature scheme needs at least one secret")
        for position, key in enumerate(held, 1):
            # hmac accepts an empty key, and anyone can sign with it.
            if not key.get_secret_value():
                raise ConfigError(f"secret #{position} for the {scheme} signature is empty")
        self._keys = held

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"SigningKeys({len(self._keys)} keys)"

    def match(
        self,
        message: bytes,
        candidates: Sequence[bytes],
        algorithm: Algorithm,
        digest: str = "hmac",
    ) -> bool:
        """Whether any key's HMAC of ``message`` (``digest = "hash"``: the plain hash of the
        key followed by ``message``) equals any of the ``candidates``."""
        for key in self._keys:
            secret = key.get_secret_value()
            if digest == "hash":
                expected = hashlib.new(algorithm, secret + message).digest()
            else:
                expected = hmac.new(secret, message, algorithm).digest()
            if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
                return True
        return False

    def holds(self, offered: bytes) -> bool:
        """Whether ``offered`` is one of the keys (a token or credentials), compared in
        constant time: their digests, so that not even a key's length shows."""
        wanted = hashlib.sha256(offered).digest()
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(hashlib.sha256(key.get_secret_value()).digest(), wanted)
        return found


def decode_signature(text: str, encoding: Encoding) -> bytes | None:
    """The digest written in ``text``, or None if it is not valid ``encoding``.

    Comparing decoded digests (not text) lets ``compare_digest`` take any input: on
    ``str`` it raises ``TypeError`` for non-ASCII, which a sender could trigger.
    """
    if encoding == "hex":
        return bytes.fromhex(text) if _HEX.fullmatch(text) else None
    try:
        digest = base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        return None
    return digest or None
