"""What ``keylane deliveries`` and the web view read: the deliveries kept, listed by a
filter a page at a time, and one shown whole. Two kinds, one id format
(``SOURCE/MS-SEQ``, :mod:`keylane.routing.contract.kept_deliveries`), listed together
newest first:

* turned away at the door, or accepted with every event ignored (no mapping for its
  type): kept in a bounded Redis stream per source (what an entry holds:
  ``routing/contract/door.py``);
* accepted: kept in the store's ``deliveries`` table by the lane of one of its events,
  with the journal rows (and review rows) of the events it became.

The page: ``ops/docs/deliveries.md``. Printing is the callers' (``ops/cli_deliveries.py``).
"""

from __future__ import annotations

import base64
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..routing.contract.door import NAMES, read_entry
from ..routing.contract.errors import KeylaneError, StoreMissing
from ..routing.contract.kept_deliveries import parse_delivery_id as parse_id
from ..routing.contract.kept_deliveries import request_body
from ..routing.contract.settings import Settings
from ..routing.contract.sources import load_sources
from ..workers.delivery_store import KeptDelivery, KeptQuery
from ..workers.stores.sql import SqlStore
from .cli_common import cli_store
from .deployment_view import DeploymentView

#: How many entries one XREVRANGE reads while looking for those a filter wants.
PAGE = 200

#: A delivery's status: accepted (its events went to their lanes), or a door's name.
STATUSES = ("accepted", *NAMES)
#: What its events became (``dead-lettered``: the journal's ``dead_lettered``;
#: ``ignored``: no mapping for its type, so no event at all).
OUTCOMES = ("applied", "refused", "dead-lettered", "ignored")


@dataclass(frozen=True)
class DeliveryQuery:
    """Which deliveries to list: of these sources (all when empty), of these statuses (a
    name of :data:`STATUSES` or an HTTP status; all when empty), one of whose events had
    an outcome of ``outcomes`` (:data:`OUTCOMES`; any when empty), newer than
    ``since_s`` seconds ago, ``limit`` a page, the page after the delivery ``before``."""

    sources: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since_s: float | None = None
    limit: int = 20
    before: str | None = None
    outcomes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for value in self.statuses:
            if value not in STATUSES and not value.isdigit():
                raise KeylaneError(
                    f"--status {value}: a name ({', '.join(STATUSES)}) or an HTTP status"
                )
        for value in self.outcomes:
            if value not in OUTCOMES:
                raise KeylaneError(f"--outcome {value}: one of {', '.join(OUTCOMES)}")
        if self.before is not None:
            parse_delivery_id(self.before)

    @property
    def wants_door(self) -> bool:
        """Whether the door streams may hold what it asks for."""
        if self.outcomes and "ignored" not in self.outcomes:
            return False
        return not self.statuses or set(self.statuses) != {"accepted"}

    @property
    def wants_store(self) -> bool:
        """Whether the store's kept deliveries may hold what it asks for."""
        if self.outcomes and set(self.outcomes) == {"ignored"}:
            return False
        return not self.statuses or "accepted" in self.statuses or "202" in self.statuses


@dataclass(frozen=True)
class DeliveryPage:
    """One page of deliveries, newest first, and the ID to pass as ``before`` for the next
    page (None on the last)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    next_before: str | None = None


def list_deliveries(settings: Settings, query: DeliveryQuery) -> DeliveryPage:
    """The page of kept deliveries (both kinds, newest first) that ``query`` asks for."""
    found: list[dict[str, Any]] = []
    if query.wants_door:
        found += _door_entries(settings, query)
    if query.wants_store:
        found += _store_entries(settings, query)
    found.sort(key=lambda e: _order(e["id"]), reverse=True)
    page = found[: query.limit]
    more = len(found) > query.limit or len(page) == query.limit
    return DeliveryPage(page, page[-1]["id"] if page and more else None)


def show_delivery(settings: Settings, delivery_id: str) -> dict[str, Any]:
    """The delivery ``delivery_id`` (``SOURCE/MS-SEQ``) as kept, with (accepted) the
    events it became and each one's outcome; KeylaneError when none is kept."""
    source, entry_id = parse_delivery_id(delivery_id)
    with _store(settings) as store:
        kept = store.kept_delivery(delivery_id) if store is not None else None
        if kept is not None:
            return accepted_entry(kept, store)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        fields = view.door_entry(source, entry_id)
    finally:
        view.close()
    if fields is None:
        raise KeylaneError(f"no delivery {delivery_id} kept (past its window or bound, or never)")
    return door_entry(read_entry(source, entry_id, fields))


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
    """``SOURCE/MS-SEQ`` as its source and ``MS-SEQ``; a clear error for anything else,
    before Redis or the store is asked."""
    return parse_id(text)


def door_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A door stream's entry (:func:`read_entry`) as listed beside accepted ones."""
    ignored = entry["status_name"] == "ignored"
    return {**entry, "kind": "door", "outcomes": ["ignored"] if ignored else [], "events": []}


def accepted_entry(kept: KeptDelivery, store: SqlStore | None = None) -> dict[str, Any]:
    """A kept accepted delivery in the shape of a door entry, with ``events``: each
    event's journal row (and, given ``store``, its review rows)."""
    request = kept.request
    body = request_body(request)
    events = [_event(asdict(e)) for e in kept.events]
    if store is not None and events:
        rows = store.dead_letters_of(kept.source, [e["event_id"] for e in events])
        for event in events:
            event["dead_letters"] = [
                _dead_letter(asdict(r)) for r in rows if r.event_id == event["event_id"]
            ]
    outcomes = sorted({e["outcome"] for e in events})
    return {
        "id": kept.id,
        "at_ms": int(kept.received_at * 1000),
        "source": kept.source,
        "status": 202,
        "status_name": "accepted",
        "code": "",
        "detail": ", ".join(f"{sum(e['outcome'] == o for e in events)} {o}" for o in outcomes),
        "method": request["method"],
        "path": request["path"],
        "query": request["query"],
        "headers": request["headers"],
        "verified": True,
        "verified_by": request["verified_by"],
        "size": request["size"],
        "sha256": request["sha256"],
        "body_kept": len(body),
        "body_cut": len(body) < request["size"],
        "body": body,
        "kind": "accepted",
        "outcomes": outcomes,
        "events": events,
    }


def _event(row: dict[str, Any]) -> dict[str, Any]:
    outcome = "dead-lettered" if row["outcome"] == "dead_lettered" else row["outcome"]
    keep = ("event_id", "record_key", "revision", "attempts", "recorded_at", "result")
    return {"outcome": outcome, **{k: row[k] for k in keep}}


def _dead_letter(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "reason", "status", "error", "created_at")
    return {k: row[k] for k in keep}


def _door_entries(settings: Settings, query: DeliveryQuery) -> list[dict[str, Any]]:
    names = list(query.sources) or load_sources(settings).names()
    wanted = set(query.statuses)
    if query.outcomes:  # the door's only outcome: ignored
        wanted = {"ignored"}
    oldest = "-" if query.since_s is None else str(int((time.time() - query.since_s) * 1000))
    start = "+" if query.before is None else "(" + parse_delivery_id(query.before)[1]
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        return [
            door_entry(entry)
            for name in names
            for entry in _matching(view, name, start, oldest, wanted, query.limit)
        ]
    finally:
        view.close()


def _store_entries(settings: Settings, query: DeliveryQuery) -> list[dict[str, Any]]:
    before = _order(query.before) if query.before is not None else None
    kept = KeptQuery(
        before_s=time.time() + 3600 if before is None else before[0] / 1000,
        # Deliveries of the page's last millisecond may come again: read past them.
        limit=query.limit + PAGE,
        sources=query.sources,
        outcomes=tuple("dead_lettered" if o == "dead-lettered" else o for o in query.outcomes),
        since_s=None if query.since_s is None else time.time() - query.since_s,
    )
    with _store(settings) as store:
        if store is None:
            return []
        rows = store.kept_deliveries(kept)
    entries = [accepted_entry(row) for row in rows]
    return [e for e in entries if before is None or _order(e["id"]) < before]


class _store:
    """The deployment's store for one read, or None when there is none yet (no lane has
    run: nothing accepted is kept)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store: SqlStore | None = None

    def __enter__(self) -> SqlStore | None:
        try:
            self.store = cli_store(self.settings)
        except StoreMissing:
            self.store = None
        return self.store

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:
            self.store.close()


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


def _order(delivery_id: str) -> tuple[int, int, str]:
    source, entry = parse_delivery_id(delivery_id)
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq), source
