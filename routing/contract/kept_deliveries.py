"""Deliveries kept: a source's window, the one format of a delivery's id, and what is kept
of an accepted delivery's request (pure; ops/docs/deliveries.md).

A source keeps ``off`` (nothing, not even its refusals at the door), ``errors`` (the
default, ``KEYLANE_KEEP_DELIVERIES``: what the door refused or found no mapping for, and
an accepted delivery one of whose events was refused or dead-lettered) or ``all``.

**Ids.** Every delivery has one id, ``SOURCE/MS-SEQ``, whichever kind it is: a delivery
the receiver turned away (or whose events were all ignored) is named by the entry of its
source's door stream (Redis gives ``MS-SEQ``); an accepted one by the receiver, which
mints the id as it reads it (``MS`` its time, ``SEQ`` a random number of at least
:data:`MINTED_SEQ_MIN`, never a stream's). Every event carries the id of the delivery it
came from (``Event.delivery``) and the journal keeps it.

**The request** of an accepted delivery (:func:`kept_request`), when its source's window
is not ``off``, travels with each of its events (``Event.request``): method, path, query
and headers redacted as the door redacts them (:mod:`.door`), the body cut at
:data:`~.door.DOOR_BODY_MAX_BYTES`, the size and SHA-256 of the whole body, and how it
was verified. The lane that applies an event writes it to the store's ``deliveries``
table (once per delivery id) when the window keeps the event's outcome (:func:`keeps`).
"""

from __future__ import annotations

import base64
import hashlib
import random
import re
import time
from collections.abc import Mapping
from typing import Any, Literal, get_args

from .door import (
    DOOR_BODY_MAX_BYTES,
    body_holds_secret,
    redact_headers,
    redact_query,
    scheme_reads,
)
from .errors import KeylaneError
from .signing import VerifyConfig

Window = Literal["off", "errors", "all"]
WINDOWS: tuple[str, ...] = get_args(Window)
#: The outcomes a window of ``errors`` keeps a delivery for.
ERROR_OUTCOMES = frozenset({"refused", "dead_lettered"})
#: A minted id's sequence number is at least this (a stream's are small).
MINTED_SEQ_MIN = 1 << 40

DELIVERY_ID = re.compile(r"(?P<source>[a-z0-9_.-]{1,64})/(?P<entry>\d{1,15}-\d{1,20})")


def new_delivery_id(source: str, now_s: float | None = None) -> str:
    """A fresh id for an accepted delivery of ``source`` (see the module docstring)."""
    ms = int((time.time() if now_s is None else now_s) * 1000)
    return f"{source}/{ms}-{MINTED_SEQ_MIN + random.getrandbits(40)}"


def parse_delivery_id(text: str) -> tuple[str, str]:
    """``SOURCE/MS-SEQ`` as its source and ``MS-SEQ``; :class:`KeylaneError` for anything
    else, before Redis or the store is asked (Redis would refuse a malformed stream id,
    and its refusal reads as Redis being down)."""
    found = DELIVERY_ID.fullmatch(text)
    if found is None:
        raise KeylaneError(f"not a delivery id: {text!r} (SOURCE/MS-SEQ, as listed)")
    return found["source"], found["entry"]


def delivery_time_s(delivery_id: str) -> float:
    """When the delivery ``delivery_id`` came, in seconds since the epoch."""
    return int(parse_delivery_id(delivery_id)[1].split("-")[0]) / 1000


def keeps(window: str, outcome: str) -> bool:
    """Whether a source keeping ``window`` keeps an accepted delivery one of whose events
    had ``outcome``."""
    return window == "all" or (window == "errors" and outcome in ERROR_OUTCOMES)


def kept_request(
    *,
    window: str,
    verify: VerifyConfig,
    method: str,
    path: str,
    query: bytes,
    headers: Mapping[str, str],
    body: bytes,
) -> dict[str, Any]:
    """What an event carries of its (verified) delivery: the request, redacted as the
    door redacts, its body cut at the door's cap (as text, or ``body_base64`` when not
    UTF-8), and ``window``, which decides whether its lane keeps it."""
    named_headers, named_params = scheme_reads(verify)
    # A body that holds the source's secret (Graph's clientState) is never kept.
    kept = b"" if body_holds_secret(verify) else body[:DOOR_BODY_MAX_BYTES]
    request: dict[str, Any] = {
        "window": window,
        "method": method,
        "path": path,
        "query": redact_query(query, named_params),
        "headers": redact_headers(headers, named_headers),
        "verified_by": str(getattr(verify, "scheme", "none")),
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "body_kept": len(kept),
    }
    try:
        request["body"] = kept.decode()
    except UnicodeDecodeError:
        request["body_base64"] = base64.b64encode(kept).decode()
    return request


def request_body(request: Mapping[str, Any]) -> bytes:
    """The body bytes a kept request holds."""
    if "body_base64" in request:
        return base64.b64decode(request["body_base64"])
    return str(request.get("body", "")).encode()
