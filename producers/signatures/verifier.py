"""The verifier interface, and the header and timestamp checks every scheme shares.

A verifier answers one question: did the sender sign this body? It raises
:class:`~keylane.routing.contract.errors.SignatureError` (answered 401) when not. Its
messages are read by both the operator and the sender, so they say what was wrong with
the delivery and never what the right signature would have been.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import field
from datetime import datetime
from typing import Protocol

from ...routing.contract.errors import SignatureError
from ...routing.hot_records import hot_record

# Whole Unix seconds (or milliseconds) in ASCII digits only: ``\d`` would also take other
# scripts' digits, which ``int()`` accepts. Twelve digits reach past the year 30000 (fifteen
# in milliseconds) and keep ``int()`` cheap.
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")
_UNIX_MILLISECONDS = re.compile(r"[0-9]{1,15}")
# An ISO 8601 date and time in ASCII, with its zone (Z or an offset) and at most
# microseconds: what fromisoformat then reads without guessing a zone.
_ISO_8601 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2})"
)


@hot_record
class Target:
    """The request line a delivery came on, for schemes that sign or carry more than the
    body: its method, the URL the sender called (``KEYLANE_PUBLIC_URL`` or the source's
    ``public_url``, then the path and query as sent; ``""`` when none is configured) and
    its query parameters (the first value of each)."""

    method: str = "POST"
    url: str = ""
    query: Mapping[str, str] = field(default_factory=dict)


NO_TARGET = Target()


@hot_record
class Verified:
    """What a verified delivery's signature headers vouch for."""

    scheme: str
    # The id carried by the scheme's headers (webhook-id, X-GitHub-Delivery,
    # X-Shopify-Webhook-Id); None when the scheme has none (Stripe's is in the body).
    event_id: str | None
    # The signed timestamp, for schemes that sign one.
    timestamp: float | None


class Verifier(Protocol):
    """Checks that a delivery was signed by its sender."""

    name: str

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """What the delivery's signature vouches for; raises ``SignatureError`` if it fails.
        ``target``: the request line it came on (:class:`Target`)."""
        ...


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` keyed by lowercased name; the first of a repeated header wins.

    The first wins because that is what starlette's ``Headers.get`` answers, so the
    receiver and the verifier never look at different copies of one header.
    """
    lowered: dict[str, str] = {}
    for name, value in headers.items():
        lowered.setdefault(name.lower(), value)
    return lowered


def require_header(headers: Mapping[str, str], name: str) -> str:
    """The stripped value of header ``name`` (lowercase) in lowercased ``headers``."""
    value = headers.get(name, "").strip()
    if not value:
        raise SignatureError(f"missing header {name}")
    return value


def malformed(header: str, detail: str) -> SignatureError:
    """The error for a header that is present but cannot be read."""
    return SignatureError(f"malformed header {header}: {detail}")


def parse_timestamp(raw: str, header: str, unit: str = "s") -> int:
    """The Unix seconds in ``raw``, the value of ``header`` (``unit = "ms"``: it holds
    milliseconds; the whole seconds of them are returned; ``"iso"``: an ISO 8601 date and
    time with its zone, ``2021-07-25T10:00:00Z``)."""
    if unit == "iso":
        if not _ISO_8601.fullmatch(raw):
            raise malformed(header, "timestamp is not an ISO 8601 date and time with its zone")
        try:
            return int(datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp())
        except ValueError:  # a month 13, a day 32
            raise malformed(header, "timestamp is not a date and time") from None
    if unit == "ms":
        if not _UNIX_MILLISECONDS.fullmatch(raw):
            raise malformed(header, "timestamp is not whole Unix milliseconds")
        return int(raw) // 1000
    if not _UNIX_SECONDS.fullmatch(raw):
        raise malformed(header, "timestamp is not whole Unix seconds")
    return int(raw)


def check_tolerance(timestamp: int, now: float, tolerance_s: int) -> None:
    """Refuse a signed ``timestamp`` more than ``tolerance_s`` away from ``now``, either way.

    The past bound limits replays of a captured delivery; the future bound stops a
    sender with a fast clock (or an attacker) from minting signatures that stay valid
    for longer than the tolerance.
    """
    skew_s = now - timestamp
    if abs(skew_s) > tolerance_s:
        direction = "in the past" if skew_s > 0 else "in the future"
        raise SignatureError(
            f"timestamp outside tolerance: {abs(skew_s):.0f} s {direction}, "
            f"tolerance {tolerance_s} s"
        )


def no_match() -> SignatureError:
    """The error for a well-formed signature that no configured secret produced."""
    return SignatureError("no signature matched")
