"""Working through dead letters: retry, discard, resolve; the diff a person decides on.

* **retry** sends the row's event back through its record's lane, from a fresh read. If
  the row holds its record (policy ``hold``), the retry goes first in the record's list,
  runs first, and the events parked behind it follow in order; otherwise it joins the tail
  like a new event. A row is queued once (a marker in Redis), and the store's journal lets
  a retried event apply at most once, so retrying twice, or concurrently, is harmless.
* **discard** / **resolve** close the row (with who, when and a note); if it held its key,
  a release message lets the parked events go, in order. Run again on a closed row that
  still holds its key (a crash between closing and releasing), they send the release.

On RabbitMQ the retry is published to the shard's quorum queue with a publisher confirm,
through the receiver's publisher (:class:`AmqpTriageBroker`); its marker is written in
Redis after the confirm, so a crash in between leaves the row open and unmarked, the next
retry publishes a second copy, and the journal applies it at most once. A held record is
a row of the store's ``held`` table there (the shard's consumer writes it, fenced); the
release and the retry travel through the shard queue as on Redis, and the consumer acts
on them in the record's order.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..producers.amqp import AmqpEventQueue
from ..routing import ShardMap
from ..routing.contract.errors import KeylaneError
from ..routing.contract.events import Event, parse_changes
from ..routing.contract.message import (
    RETRY_OF_HEADER,
    build_event_message,
    build_unhold_message,
    with_header,
)
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from ..routing.redis_keys import ONCE_MARKER_TTL_MS
from ..workers.brokers.redis import RedisLaneBroker
from ..workers.changes import apply_changes
from ..workers.resources import open_resource
from ..workers.store import DeadLetterStore, ParkingStore, RecordStore
from ..workers.store_rows import DeadLetter, DeadLetterStatus

#: Reasons whose event cannot be applied by retrying it as it is.
NOT_RETRYABLE = {
    "malformed": "the message could not be read; there is no event to retry",
    "id_reused": "the event id was already applied with its first body; resolve or discard",
    "merge_review": "a merge is decided with keylane merges resolve (a side per field) or "
    "keylane merges apart",
}

TriageOutcome = Literal["queued", "already queued", "closed", "skipped"]


@dataclass(frozen=True)
class Handled:
    """What an operation did to one row."""

    row_id: int
    outcome: TriageOutcome
    detail: str = ""


class TriageBroker(Protocol):
    """Where triage queues a row's messages: the Redis lane broker
    (:class:`~keylane.workers.brokers.redis.RedisLaneBroker`) or, on RabbitMQ,
    :class:`AmqpTriageBroker`."""

    shards: ShardMap

    def held_by(self, record_key: str) -> int | None: ...

    def queued(self, record_key: str) -> int: ...

    def push_once(self, marker: str, shard: int, raw: bytes) -> bool: ...

    def close(self) -> None: ...


def open_triage_broker(settings: Settings, store: ParkingStore) -> TriageBroker:
    """Where triage queues a row's messages on ``settings``' broker (on RabbitMQ, which
    row holds a record and what waits behind it is ``store``'s parking)."""
    if settings.broker_is_rabbitmq:
        return AmqpTriageBroker(settings, store)
    return RedisLaneBroker.from_settings(settings)


class AmqpTriageBroker:
    """Triage on RabbitMQ: a message goes to its shard's quorum queue with a publisher
    confirm, through the receiver's confirming publisher; which row
    holds a record, and what waits behind it, the store says (the shard's consumer parks
    a held record's messages there)."""

    def __init__(self, settings: Settings, store: ParkingStore) -> None:
        self.shards = settings.shards
        self._store = store
        self._runner = asyncio.Runner()  # one loop for every publish, in the calling thread
        self._queue = AmqpEventQueue(settings)

    def held_by(self, record_key: str) -> int | None:
        shard = self.shards.shard_for_key(record_key)
        return self._store.held(shard, record_key).get(record_key)

    def queued(self, record_key: str) -> int:
        """The record's parked messages (those its consumer still holds in memory, not
        parked yet, are not counted)."""
        return self._store.parked_count(self.shards.shard_for_key(record_key), record_key)

    def push_once(self, marker: str, shard: int, raw: bytes) -> bool:
        return self._runner.run(self._queue.push_once(marker, shard, raw, ONCE_MARKER_TTL_MS))

    def close(self) -> None:
        """Close the publisher's connections."""
        try:
            self._runner.run(self._queue.close())
        finally:
            self._runner.close()


class Triage:
    """Operations on review rows, for the CLI: their status in ``store``, their messages
    through ``broker``."""

    def __init__(self, store: DeadLetterStore, broker: TriageBroker) -> None:
        self.store = store
        self.broker = broker

    def retry(self, row: DeadLetter, by: str, note: str | None = None) -> Handled:
        """Queue the row's event again (see the module docstring)."""
        if row.status not in ("open", "retried"):
            return Handled(row.id, "skipped", f"status is {row.status}")
        if row.reason in NOT_RETRYABLE:
            return Handled(row.id, "skipped", NOT_RETRYABLE[row.reason])
        at_head = self.broker.held_by(row.record_key) == row.id
        shard, message = self._retry_message(row)
        queued = self.broker.push_once(f"retry:{row.id}", shard, message)
        # The row is marked after the push: a crash in between leaves it open, and the
        # next retry completes the job without queueing a second copy.
        self.store.set_dead_letter_status(row.id, "retried", ("open",), by, note)
        return Handled(
            row.id,
            "queued" if queued else "already queued",
            "at the head, ahead of its parked events" if at_head and queued else "",
        )

    def _retry_message(self, row: DeadLetter) -> tuple[int, bytes]:
        """The shard and message that retry ``row``: its event again, marked as the retry
        of the row; a message parked for its wire version, as it came (a worker that reads
        it runs now, or it is parked again)."""
        if row.reason == "wire_version":
            return row.shard, with_header(str(row.event["raw"]).encode(), RETRY_OF_HEADER, row.id)
        event = Event.model_validate(row.event).model_copy(
            update={"retry_of": row.id, "accepted_at": time.time(), "review": None}
        )
        queue = self.broker.shards.queue_name(event.shard)
        return event.shard, build_event_message(event, queue)

    def close(
        self, row: DeadLetter, status: DeadLetterStatus, by: str, note: str | None = None
    ) -> Handled:
        """Discard or resolve the row; release its key if it held one. A row closed
        already that still holds its key (this command crashed between closing it and
        sending the release, or the hold came while it was being closed) gets its
        release sent now."""
        closed = self.store.set_dead_letter_status(row.id, status, ("open",), by, note)
        if not closed and row.status not in ("discarded", "resolved"):
            return Handled(row.id, "skipped", f"status is {row.status}, not open")
        if self.broker.held_by(row.record_key) != row.id:
            if not closed:
                return Handled(row.id, "skipped", f"status is {row.status}, not open")
            return Handled(row.id, "closed")
        queue = self.broker.shards.queue_name(row.shard)
        message = build_unhold_message(row.record_key, row.id, queue)
        parked = self.broker.queued(row.record_key)  # before the lanes release them
        sent = self.broker.push_once(f"release:{row.id}", row.shard, message)
        detail = f"released {row.record_key}: {parked} parked event(s) go next"
        if closed:
            return Handled(row.id, "closed", detail)
        if not sent:
            return Handled(row.id, "already queued", f"the release of {row.record_key}")
        return Handled(row.id, "queued", f"status is {row.status}; {detail}")


@dataclass(frozen=True)
class FieldDiff:
    """One field of ``dlq show``: the attempted change beside the record as it is now."""

    field: str
    change: dict[str, Any] | None
    now: Any
    would_be: Any
    differs: bool


ABSENT = "(absent)"


@dataclass(frozen=True)
class RecordNow:
    """The row's record as it is now, where it lives: keylane's own store (``where`` is
    ``keylane``) or the version-checked destination the event was written to. ``error``
    says why it could not be read from here (then ``version`` is None and ``fields``
    empty)."""

    where: str
    version: int | str | None
    fields: dict[str, Any]
    error: str | None = None


DeadLetterKind = Literal["records", "elsewhere", "delivery"]


def kind_of(row: DeadLetter) -> DeadLetterKind:
    """What the row's event was for: a change to keylane's own records, a change to a
    record that lives elsewhere (a source's ``records_in``), or a delivery to a task or an
    HTTP forward (its payload, no change)."""
    if not isinstance(row.event.get("destination"), str):
        return "records"
    return "elsewhere" if row.attempted_change else "delivery"


def record_now(
    row: DeadLetter, store: RecordStore, sources: Sources, sources_file: str | None
) -> RecordNow:
    """A fresh read of the row's record, from wherever its event was written (say why
    not when it cannot be read from here)."""
    if kind_of(row) == "records":
        record = store.read(row.record_key)
        return RecordNow("keylane", record.revision, record.fields)
    name = str(row.event["destination"])
    config = sources.destinations.get(name)
    if config is None or config.resource is None:
        where = f"the sources file {sources_file}" if sources_file else "no sources file"
        why = (
            f"destination {name} is not in this command's sources ({where}; "
            "KEYLANE_SOURCES_FILE): run it with the workers' sources file to read the record"
        )
        return RecordNow(name, None, {}, f"cannot read the record in {name}: {why}")
    try:
        resource = open_resource(config.resource)
        try:
            snapshot = resource.read(row.record_key)
        finally:
            resource.close()
    except Exception as exc:  # shown, not raised: the row itself is still worth reading
        return RecordNow(name, None, {}, f"cannot read the record in {name}: {exc}")
    return RecordNow(config.name, snapshot.version, snapshot.fields)


def field_diffs(row: DeadLetter, fields_now: Mapping[str, Any]) -> list[FieldDiff]:
    """For each field the change touches: the change, the value now, the value the change
    would give if applied to the record now, and whether those two differ."""
    diffs = []
    for field, wire in sorted(row.attempted_change.items()):
        now = fields_now.get(field, ABSENT)
        try:
            changes = parse_changes({field: wire})
            after = apply_changes({k: copy.deepcopy(v) for k, v in fields_now.items()}, changes)
            would_be: Any = after.get(field, ABSENT)
        except (ValueError, KeylaneError) as exc:
            would_be = f"(cannot apply: {exc})"
        diffs.append(FieldDiff(field, wire, now, would_be, would_be != now))
    return diffs


def stats_summary(rows: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """``dlq stats``: counts by status, by reason and by source (open rows), and the age
    of the oldest open row."""
    by_status: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    by_source: dict[str, int] = {}
    oldest_open: float | None = None
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + r["count"]
        if r["status"] != "open":
            continue
        by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + r["count"]
        by_source[r["source"]] = by_source.get(r["source"], 0) + r["count"]
        oldest_open = r["oldest"] if oldest_open is None else min(oldest_open, r["oldest"])
    return {
        "by_status": by_status,
        "open_by_reason": by_reason,
        "open_by_source": by_source,
        "oldest_open_age_s": None if oldest_open is None else round(now - oldest_open, 1),
    }
