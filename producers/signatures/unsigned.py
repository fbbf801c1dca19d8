"""The ``none`` scheme: deliveries are not signed, so every one verifies.

For the ``demo`` source and for senders on a trusted network only.
"""

from __future__ import annotations

from collections.abc import Mapping

from .verifier import NO_TARGET, Target, Verified


class UnsignedVerifier:
    """Accepts every delivery."""

    name: str

    def __init__(self) -> None:
        self.name = "none"

    def __repr__(self) -> str:
        return "UnsignedVerifier()"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Always verified, vouching for nothing."""
        return Verified(scheme=self.name, event_id=None, timestamp=None)
