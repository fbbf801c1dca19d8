"""Deliveries turned away at the door: what the receiver keeps of a refusal (the fields
of one entry of the source's bounded stream, ``RedisKeys.door``), what it redacts, and how
a refusal's status is named. Pure: the receiver writes entries through its gateway
(``producers/door.py``), ``keylane deliveries`` reads them (``ops/cli_deliveries.py``).

What is redacted (the value replaced by :data:`REDACTED`, the name kept):

* a header whose lowercased name contains one of :data:`SECRET_WORDS` (``authorization``,
  ``cookie``, ``x-hub-signature-256``, ``x-gitlab-token``, ``x-api-key``, ...), or that the
  source's verify scheme reads (its signature header, a token check's header);
* a query parameter whose name contains one of them, or that a token check reads.

An unverified delivery (401) keeps metadata only: never its body, whatever it was.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from .presets import PRESETS
from .signing import HmacConfig, PresetConfig, VerifyConfig

#: The most of a refused body kept (its size and SHA-256 are of the whole body).
DOOR_BODY_MAX_BYTES = 16 * 1024
#: The most headers kept of one delivery, and the most of each value.
DOOR_MAX_HEADERS = 64
DOOR_HEADER_MAX_CHARS = 1024
REDACTED = "[redacted]"
#: A header or query parameter whose name contains one of these is redacted.
SECRET_WORDS = ("auth", "cookie", "sig", "token", "secret", "passw", "key", "hmac", "session")

#: A refusal's name by HTTP status (any other 4xx: ``invalid``).
STATUS_NAMES = {401: "unverified", 403: "unverified", 409: "reused", 429: "throttled"}
NAMES = ("ignored", "invalid", "unverified", "reused", "throttled", "overloaded")


def status_name(status: int) -> str:
    """What a refusal is called in ``keylane deliveries``: ``unverified`` (401, 403),
    ``reused`` (409), ``throttled`` (429), ``overloaded`` (503), else ``invalid``; a 2xx
    kept here is a delivery whose events were all ``ignored`` (no mapping for them)."""
    if status < 300:
        return "ignored"
    if status >= 500:
        return "overloaded"
    return STATUS_NAMES.get(status, "invalid")


def is_kept(status: int, code: str) -> bool:
    """Whether a refusal is kept: every 4xx and 503 of a known source, except when Redis
    itself is down (``broker_unavailable``: there is nowhere to keep it)."""
    return (400 <= status < 500 or status == 503) and code != "broker_unavailable"


def scheme_reads(verify: VerifyConfig) -> tuple[frozenset[str], frozenset[str]]:
    """The header names and query parameters the source's verify scheme reads a secret
    or a signature from (lowercased)."""
    headers: set[str] = set()
    params: set[str] = set()
    if isinstance(verify, HmacConfig):
        headers.add(verify.header.lower())
    elif isinstance(verify, PresetConfig):
        preset = PRESETS[verify.scheme]
        if preset.layout is not None:
            headers.add(preset.layout.header.lower())
        if preset.check == "token":
            kind, _, name = verify.token_at.partition(":")
            (headers if kind == "header" else params).add(name.lower())
    return frozenset(headers), frozenset(params)


def body_holds_secret(verify: VerifyConfig) -> bool:
    """Whether the source's check reads its shared secret from the body itself
    (Microsoft Graph's ``clientState``): such a body is never kept."""
    return isinstance(verify, PresetConfig) and PRESETS[verify.scheme].check == "graph"


#: Any of :data:`SECRET_WORDS` in a lowercased name (one scan, not one per word).
_SECRET_WORD = re.compile("|".join(re.escape(word) for word in SECRET_WORDS))


@functools.lru_cache(maxsize=1024)
def _has_secret_word(lowered: str) -> bool:
    # Every accepted delivery's headers are redacted (its request travels with its
    # events): their names repeat from one delivery to the next.
    return _SECRET_WORD.search(lowered) is not None


def _secret(name: str, named: frozenset[str]) -> bool:
    lowered = name.lower()
    return lowered in named or _has_secret_word(lowered)


def redact_headers(headers: Mapping[str, str], named: frozenset[str]) -> dict[str, str]:
    """``headers`` with every secret one's value redacted, at most
    :data:`DOOR_MAX_HEADERS`, each value cut at :data:`DOOR_HEADER_MAX_CHARS`."""
    kept: dict[str, str] = {}
    for name, value in list(headers.items())[:DOOR_MAX_HEADERS]:
        kept[name] = REDACTED if _secret(name, named) else value[:DOOR_HEADER_MAX_CHARS]
    return kept


def redact_query(query: bytes, named: frozenset[str]) -> str:
    """The query string with every secret parameter's value redacted."""
    if not query:
        return ""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, REDACTED if _secret(k, named) else v) for k, v in pairs])


def door_entry(
    *,
    source: str,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    status: int,
    code: str,
    detail: str,
    body: bytes | None,
    verified: bool,
) -> dict[str, bytes | str | int]:
    """One kept refusal as the stream's fields. ``body``: what arrived (None: not read);
    kept, cut at :data:`DOOR_BODY_MAX_BYTES`, only when ``verified``."""
    size = len(body) if body is not None else 0
    entry: dict[str, bytes | str | int] = {
        "source": source,
        "method": method,
        "path": path,
        "query": query,
        "headers": json.dumps(headers, separators=(",", ":")),
        "status": status,
        "code": code,
        "detail": detail[:DOOR_HEADER_MAX_CHARS],
        "size": size,
        "sha256": hashlib.sha256(body).hexdigest() if body is not None else "",
        "verified": int(verified),
    }
    if body is not None and verified:
        entry["body"] = body[:DOOR_BODY_MAX_BYTES]
    return entry


def read_entry(source: str, entry_id: str, fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """A kept refusal as ``keylane deliveries`` shows it (the body as bytes, or None)."""

    def text(name: str) -> str:
        return fields.get(name.encode(), b"").decode("utf-8", "replace")

    status = int(text("status") or 0)
    body = fields.get(b"body")
    size = int(text("size") or 0)
    return {
        "id": f"{source}/{entry_id}",
        "at_ms": int(entry_id.split("-")[0]),
        "source": source,
        "status": status,
        "status_name": status_name(status),
        "code": text("code"),
        "detail": text("detail"),
        "method": text("method"),
        "path": text("path"),
        "query": text("query"),
        "headers": json.loads(text("headers") or "{}"),
        "verified": text("verified") == "1",
        "size": size,
        "sha256": text("sha256"),
        "body_kept": len(body) if body is not None else 0,
        "body_cut": body is not None and len(body) < size,
        "body": body,
    }
