"""What ``keylane deliveries`` and the web view read: the deliveries kept, listed by a
filter a page at a time, and one shown whole. Today these are the deliveries the receiver
turned away at the door, kept in a bounded Redis stream per source (what an entry holds:
``routing/contract/door.py``; the page: ``ops/docs/deliveries.md``). Printing is the
callers' (``ops/cli_deliveries.py``)."""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..routing.contract.door import NAMES, read_entry
from ..routing.contract.errors import KeylaneError
from ..routing.contract.settings import Settings
from ..routing.contract.sources import load_sources
from .deployment_view import DeploymentView

#: How many entries one XREVRANGE reads while looking for those a filter wants.
PAGE = 200

STREAM_ID = re.compile(r"\d+(-\d+)?")


@dataclass(frozen=True)
class DeliveryQuery:
    """Which deliveries to list: of these sources (all when empty), of these statuses (a
    name of :data:`NAMES` or an HTTP status; all when empty), newer than ``since_s``
    seconds ago, ``limit`` a page, the page after the delivery ``before``."""

    sources: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since_s: float | None = None
    limit: int = 20
    before: str | None = None

    def __post_init__(self) -> None:
        for value in self.statuses:
            if value not in NAMES and not value.isdigit():
                raise KeylaneError(
                    f"--status {value}: a name ({', '.join(NAMES)}) or an HTTP status"
                )
        if self.before is not None:
            parse_delivery_id(self.before)


@dataclass(frozen=True)
class DeliveryPage:
    """One page of deliveries, newest first, and the ID to pass as ``before`` for the next
    page (None on the last)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    next_before: str | None = None


def list_deliveries(settings: Settings, query: DeliveryQuery) -> DeliveryPage:
    """The page of kept deliveries that ``query`` asks for."""
    names = list(query.sources) or load_sources(settings).names()
    wanted = set(query.statuses)
    oldest = "-" if query.since_s is None else str(int((time.time() - query.since_s) * 1000))
    start = "+" if query.before is None else "(" + parse_delivery_id(query.before)[1]
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        found = [
            entry
            for name in names
            for entry in _matching(view, name, start, oldest, wanted, query.limit)
        ]
    finally:
        view.close()
    found.sort(key=lambda e: _order(e["id"]), reverse=True)
    page = found[: query.limit]
    more = len(found) > query.limit or len(page) == query.limit
    return DeliveryPage(page, page[-1]["id"] if page and more else None)


def show_delivery(settings: Settings, delivery_id: str) -> dict[str, Any]:
    """The delivery ``delivery_id`` (``SOURCE/STREAM-ID``) as kept; KeylaneError when none is."""
    source, entry_id = parse_delivery_id(delivery_id)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        fields = view.door_entry(source, entry_id)
    finally:
        view.close()
    if fields is None:
        raise KeylaneError(f"no delivery {delivery_id} kept (past the bound, or never)")
    return read_entry(source, entry_id, fields)


def public(entry: dict[str, Any], with_body: bool = False) -> dict[str, Any]:
    """``entry`` for JSON: the body as text (``body``) or, not UTF-8, as ``body_base64``."""
    shown = {k: v for k, v in entry.items() if k != "body"}
    body: bytes | None = entry["body"]
    if with_body and body is not None:
        try:
            shown["body"] = body.decode()
        except UnicodeDecodeError:
            shown["body_base64"] = base64.b64encode(body).decode()
    return shown


def body_kept(entry: dict[str, Any]) -> str:
    """What was kept of the delivery's body, in words."""
    if not entry["sha256"]:
        return "not read (refused before its body was)"
    if not entry["verified"]:
        return "not kept (unverified: metadata only)"
    if entry["body"] is None and entry["size"]:
        return "not kept (it carries its source's secret)"
    if entry["body_cut"]:
        return f"the first {entry['body_kept']} bytes kept"
    return "kept whole" if entry["size"] else "empty"


def parse_delivery_id(text: str) -> tuple[str, str]:
    """``SOURCE/STREAM-ID`` as its source and stream id; a clear error for anything else
    (Redis would refuse it, and its refusal reads as Redis being down)."""
    source, _, entry_id = text.rpartition("/")
    if not source or not STREAM_ID.fullmatch(entry_id):
        raise KeylaneError(f"not a delivery id: {text!r} (SOURCE/STREAM-ID, as listed)")
    return source, entry_id


def _matching(
    view: DeploymentView, source: str, start: str, oldest: str, wanted: set[str], limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` entries of ``source``'s stream from ``start`` that ``wanted`` takes."""
    found: list[dict[str, Any]] = []
    while len(found) < limit:
        page = view.door_page(source, start, oldest, PAGE)
        for entry_id, fields in page:
            entry = read_entry(source, entry_id, fields)
            if not wanted or {entry["status_name"], str(entry["status"])} & wanted:
                found.append(entry)
        if len(page) < PAGE:
            break
        start = "(" + page[-1][0]
    return found[:limit]


def _order(delivery_id: str) -> tuple[int, int]:
    ms, _, seq = delivery_id.rpartition("/")[2].partition("-")
    return int(ms), int(seq or 0)
