"""A told outcome: what keylane answers about an event once its lane decided it, and the
HTTP answer that carries it (``ops/docs/outcomes.md``).

The lane writes it (as JSON bytes) with the acknowledgement of the event, the receiver
reads it back to answer a waiting ``POST``, a ``GET /outcomes/...`` or a replay, and
``task.send(..., wait=...)`` and ``keylane outcome`` show it. Models and parsing only:
who writes and reads it is on each side (``workers/lane_tells.py``,
``producers/outcome_waits.py``).

Statuses and their HTTP answers, and why:

* ``applied`` -> **200**: the event's effect is written; the body says at which revision
  and with what result.
* ``refused`` -> **409 Conflict**: the event's conditions did not hold on the record as
  it was (RFC 9110 15.5.10: "the request could not be completed due to a conflict with
  the current state of the target resource"). Not 412: RFC 9110's Precondition Failed is
  about conditional *header fields* (``If-Match``, ...) of the request, and these
  conditions live in the event's body.
* ``dead_lettered`` -> **422 Unprocessable Content**: the delivery was well formed and
  accepted, but its change could not be applied (a type mismatch, a field the source does
  not own, a conflict that survived the attempts); a review row says why.
* not known in time -> **202**, as without ``Prefer: wait``, with ``Location`` where to
  ask later; a ``GET`` of an undecided event answers 202 ``{"status": "pending"}``.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import quote

import msgspec

ToldStatus = Literal["applied", "refused", "dead_lettered"]

#: The HTTP status of each told outcome (see the module docstring).
HTTP_STATUS: dict[str, int] = {"applied": 200, "refused": 409, "dead_lettered": 422}
#: The HTTP status of an outcome not known (yet, or in the time asked).
PENDING_STATUS = 202


class Told(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one sender event, as told."""

    status: ToldStatus
    source: str
    event_id: str
    record_key: str
    revision: int | None = None
    result: dict[str, Any] | None = None
    reason: str | None = None
    dead_letter_id: int | None = None
    decided_at: float

    @property
    def http_status(self) -> int:
        """The HTTP status that carries it."""
        return HTTP_STATUS[self.status]


class _Names(msgspec.Struct):
    source: str
    event_id: str


_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder(Told).decode
_DECODE_NAMES = msgspec.json.Decoder(_Names).decode


def encode_told(told: Told) -> bytes:
    """Its JSON body (what Redis keeps and the receiver answers with, byte for byte)."""
    return _ENCODE(told)


def decode_told(body: bytes | str) -> Told:
    """A told outcome from its JSON body (``ValueError`` if it is not one)."""
    try:
        return _DECODE(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a told outcome: {exc}") from None


def told_names(body: bytes) -> tuple[str, str] | None:
    """The ``(source, event_id)`` a told body is about, reading nothing else of it (the
    receiver's one subscription sorts every outcome it hears by these); None if it is
    not a told outcome."""
    try:
        names = _DECODE_NAMES(body)
    except msgspec.DecodeError:
        return None
    return names.source, names.event_id


def http_status_of(body: bytes) -> int:
    """The HTTP status of a told body (a quick look at ``status``; 202 when unknown)."""
    for status, code in HTTP_STATUS.items():
        if b'"status":"' + status.encode() + b'"' in body:
            return code
    return PENDING_STATUS


def pending_body(source: str, event_id: str) -> bytes:
    """The body of an outcome not known yet."""
    return _ENCODE({"status": "pending", "source": source, "event_id": event_id})


def outcome_path(source: str, event_id: str) -> str:
    """Where to ask for an event's outcome later (the ``Location`` of a 202)."""
    return f"/outcomes/{quote(source, safe='')}/{quote(event_id, safe='')}"


_WAIT = re.compile(r"^\s*wait\s*=\s*(?:(\d{1,9})|\"(\d{1,9})\")\s*$", re.IGNORECASE)


def preferred_wait_s(prefer: str | None) -> int | None:
    """The ``wait`` preference of a ``Prefer`` header (RFC 7240 4.3: ``wait=`` delta
    seconds), or None when there is none or it is malformed: RFC 7240 says a preference
    the server does not understand is ignored, never an error. Preferences are separated
    by commas; a preference's parameters (after ``;``) are not ``wait``'s business."""
    if not prefer:
        return None
    for preference in prefer.split(","):
        token = preference.split(";", 1)[0]
        if token.strip().lower().startswith("wait"):
            match = _WAIT.match(token)
            if match is None:
                return None
            return int(match.group(1) or match.group(2))
    return None
