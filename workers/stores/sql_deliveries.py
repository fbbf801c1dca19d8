"""The accepted deliveries kept (``deliveries``): written once per delivery id by the lane
that applies one of its events, in that event's transaction; read by ``keylane
deliveries`` with the journal rows and review rows of the events it became."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...routing.contract.kept_deliveries import delivery_time_s, keeps
from ..delivery_store import KeptDelivery, KeptQuery
from ..store_rows import DeadLetter, JournalEntry
from .dialect import Cursor, Dialect, dump_json
from .sql_dead_letters import dead_letter_columns, dead_letter_of
from .sql_journal import JOURNAL_COLUMNS, entry_of


def keep_delivery(
    d: Dialect, cur: Cursor, delivery_id: str, source: str, request: Mapping[str, Any]
) -> None:
    """Keep ``request`` as the delivery ``delivery_id``, unless it is kept already (a
    batched delivery's other events, a retry)."""
    cur.execute(
        "INSERT INTO deliveries (id, source, received_at, request) "
        f"VALUES (?, ?, ?, {d.json_param}) ON CONFLICT (id) DO NOTHING",
        (delivery_id, source, delivery_time_s(delivery_id), dump_json(dict(request))),
    )


def keep_dead_lettered(d: Dialect, cur: Cursor, event: Mapping[str, Any]) -> None:
    """Keep the delivery of a dead-lettered ``event`` (its wire form) when its source's
    window keeps dead letters."""
    request, delivery_id = event.get("request"), event.get("delivery")
    if request is None or delivery_id is None:
        return
    if keeps(str(request.get("window")), "dead_lettered"):
        keep_delivery(d, cur, delivery_id, str(event["source"]), request)


_COLUMNS = "id, source, received_at, {request}"


def find_delivery(d: Dialect, cur: Cursor, delivery_id: str) -> KeptDelivery | None:
    """The kept delivery ``delivery_id``, with the journal rows of its events."""
    columns = _COLUMNS.format(request=d.json_out("request"))
    cur.execute(f"SELECT {columns} FROM deliveries WHERE id = ?", (delivery_id,))
    row = cur.fetchone()
    if row is None:
        return None
    return _kept(row, events_of(cur, delivery_id))


def events_of(cur: Cursor, delivery_id: str) -> list[JournalEntry]:
    """The journal rows of the events that came from ``delivery_id``, in order."""
    cur.execute(
        f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE delivery = ? ORDER BY recorded_at",
        (delivery_id,),
    )
    return [entry_of(r) for r in cur.fetchall()]


def list_kept(d: Dialect, cur: Cursor, query: KeptQuery) -> list[KeptDelivery]:
    """Kept deliveries newest first (by time, then id), received at or before
    ``query.before_s`` and after ``query.since_s``, of ``query.sources`` (all when
    empty), one of whose events had an outcome of ``query.outcomes`` (any when empty)."""
    where: list[str] = ["received_at <= ?"]
    params: list[Any] = [query.before_s]
    if query.since_s is not None:
        where.append("received_at >= ?")
        params.append(query.since_s)
    if query.sources:
        where.append(f"source IN ({', '.join('?' for _ in query.sources)})")
        params += list(query.sources)
    if query.outcomes:
        marks = ", ".join("?" for _ in query.outcomes)
        where.append(
            "EXISTS (SELECT 1 FROM journal j WHERE j.delivery = deliveries.id "
            f"AND j.outcome IN ({marks}))"
        )
        params += list(query.outcomes)
    columns = _COLUMNS.format(request=d.json_out("request"))
    cur.execute(
        f"SELECT {columns} FROM deliveries WHERE {' AND '.join(where)} "
        "ORDER BY received_at DESC, id DESC LIMIT ?",
        (*params, query.limit),
    )
    rows = cur.fetchall()
    return [_kept(row, events_of(cur, str(row[0]))) for row in rows]


def _kept(row: Sequence[Any], events: list[JournalEntry]) -> KeptDelivery:
    request = row[3] if isinstance(row[3], dict) else json.loads(row[3])
    return KeptDelivery(str(row[0]), str(row[1]), float(row[2]), request, events)


def dead_letters_of(d: Dialect, cur: Cursor, source: str, event_ids: list[str]) -> list[DeadLetter]:
    """The review rows of these events of ``source``, oldest first."""
    if not event_ids:
        return []
    marks = ", ".join("?" for _ in event_ids)
    cur.execute(
        f"SELECT {dead_letter_columns(d)} FROM dead_letters "
        f"WHERE source = ? AND event_id IN ({marks}) ORDER BY id",
        (source, *event_ids),
    )
    return [dead_letter_of(r) for r in cur.fetchall()]
