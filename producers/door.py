"""Keeping the deliveries the receiver turns away (ops/docs/deliveries.md).

The receiver decides its answer first; :meth:`Door.keep` then makes the entry that is
kept (redacted, its body cut at the cap or left out: what waits in memory is never more
than what Redis will hold) and queues it. One task per process writes what is queued to
Redis, many refusals in one round trip (:class:`~keylane.producers.gateway.DoorLog`, on
the receiver's Redis client: one connection at a time), so keeping costs the answer no
Redis call. A failure to keep is logged and counted (``keylane_door_keep_failures_total``),
never answered: the 4xx stays a 4xx. Past :data:`DOOR_QUEUE_MAX` refusals waiting to be
written (Redis slow, a flood), more are dropped and counted. Nothing here marks an id seen
or writes the journal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..routing.contract.door import (
    body_holds_secret,
    door_entry,
    is_kept,
    redact_headers,
    redact_query,
    scheme_reads,
)
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.kept_deliveries import kept_request, new_delivery_id
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig
from .accept import KeptDelivery
from .answers import Answer
from .gateway import DoorEntry, DoorLog
from .intake import Ignored, Intake

log = logging.getLogger("keylane.receiver")

#: The most refusals waiting to be written; more are dropped (and counted).
DOOR_QUEUE_MAX = 1000
#: The least time between two log lines about refusals that could not be kept.
LOG_EVERY_S = 60.0


@dataclass
class Seen:
    """What the receiver saw of a delivery as it went: its body once read, and whether its
    check was passed (a body is kept only then)."""

    body: bytes | None = None
    verified: bool = False
    #: Why none of its events was accepted (no mapping for its type): it is kept as
    #: ``ignored``, having no lane (None: it had events, or was refused).
    ignored: str | None = None


@dataclass(frozen=True)
class _Refusal:
    source: SourceConfig
    headers: dict[str, str]
    path: str
    query: bytes
    answer: Answer
    seen: Seen


class Door:
    """One receiver process's keeper of refusals: :meth:`keep` queues, a task writes."""

    def __init__(self, log_: DoorLog, keep_per_source: int, window: str = "errors") -> None:
        self.log = log_
        self.keep_per_source = keep_per_source
        #: ``KEYLANE_KEEP_DELIVERIES``: the window of a source that names none.
        self.window = window
        self.kept = 0
        self.failed = 0
        self.dropped = 0
        self._queue: list[DoorEntry] = []
        self._writer: asyncio.Task[None] | None = None
        self._logged_at = 0.0

    def keep(
        self,
        source: SourceConfig,
        headers: dict[str, str],
        path: str,
        query: bytes,
        answer: Answer,
        seen: Seen,
    ) -> None:
        """Queue the refusal ``answer`` of a delivery to ``source`` to be kept, if it is
        one that is kept (``routing/contract/door.py``: :func:`is_kept`), or the delivery
        whose events were all ignored (``seen.ignored``); nothing of a source whose
        window is ``off``."""
        if self.keep_per_source == 0 or (source.keep_deliveries or self.window) == "off":
            return
        if seen.ignored is None and not is_kept(answer.status, answer.code):
            return
        if len(self._queue) >= DOOR_QUEUE_MAX:
            self.dropped += 1
            return
        try:
            entry = entry_of(_Refusal(source, headers, path, query, answer, seen))
        except Exception as exc:  # keeping never changes the answer
            self._failed(1, f"could not make its entry: {exc!r}")
            return
        self._queue.append(entry)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self._queue:
            entries, self._queue = self._queue, []
            try:
                failed = await self.log.keep(entries, self.keep_per_source)
            except BrokerUnavailable as exc:
                self._failed(len(entries), str(exc))
                continue
            except Exception as exc:  # the task goes on: a refusal is kept or counted
                log.exception("keeping refused deliveries failed")
                self._failed(len(entries), repr(exc))
                continue
            self.kept += len(entries) - failed
            if failed:
                self._failed(failed, "Redis refused the XADD")

    def _failed(self, count: int, why: str) -> None:
        self.failed += count
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "could not keep %d refused deliveries (%d so far): %s", count, self.failed, why
            )

    async def close(self) -> None:
        """Write what is still queued (at shutdown)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)


def kept_of(
    source: SourceConfig,
    settings: Settings,
    headers: Mapping[str, str],
    path: str,
    query: bytes,
    body: bytes,
) -> KeptDelivery:
    """A verified delivery's id, and its request when its source keeps deliveries
    (:mod:`keylane.routing.contract.kept_deliveries`): what each of its events carries
    to its lane (the receiver never writes the store)."""
    delivery_id = new_delivery_id(source.name)
    window = source.delivery_window(settings)
    if window == "off":
        return KeptDelivery(delivery_id)
    request = kept_request(
        window=window,
        verify=source.verify,
        method="POST",
        path=path,
        query=query,
        headers=headers,
        body=body,
    )
    return KeptDelivery(delivery_id, request)


def kept_for(
    source: SourceConfig,
    settings: Settings,
    taken: Sequence[Intake | Ignored],
    headers: Mapping[str, str],
    path: str,
    query: bytes,
    seen: Seen,
) -> KeptDelivery | None:
    """The delivery ``taken`` came from as its events carry it to their lanes
    (:func:`kept_of`); None when none of it became an event: it has no lane, and is kept
    at the door as ignored (``seen.ignored`` says why)."""
    if not any(isinstance(item, Intake) for item in taken):
        seen.ignored = ignored_reason(taken)
        return None
    assert seen.body is not None  # read before it was taken
    return kept_of(source, settings, headers, path, query, seen.body)


def ignored_reason(taken: Sequence[Intake | Ignored]) -> str:
    """Why a delivery none of whose items became an event was ignored, in words."""
    why = sorted({f"{i.event_type}: {i.reason}" for i in taken if isinstance(i, Ignored)})
    return "; ".join(why) or "no events in it"


def entry_of(refusal: _Refusal) -> DoorEntry:
    """What is kept of ``refusal``: redacted, its body only when verified and not a 401."""
    named_headers, named_params = scheme_reads(refusal.source.verify)
    answer = refusal.answer
    detail, code = "", answer.code
    if refusal.seen.ignored is not None:
        detail, code = refusal.seen.ignored, "ignored"
    elif answer.code:
        detail = str(msgspec.json.decode(answer.body).get("detail", ""))
    entry = door_entry(
        source=refusal.source.name,
        method="POST",
        path=refusal.path,
        query=redact_query(refusal.query, named_params),
        headers=redact_headers(refusal.headers, named_headers),
        status=answer.status,
        code=code,
        detail=detail,
        body=refusal.seen.body,
        verified=refusal.seen.verified
        and answer.status != 401
        and not body_holds_secret(refusal.source.verify),
    )
    return refusal.source.name, entry


class DoorCounts(Collector):
    """The door's counters for ``/metrics``."""

    def __init__(self, door: Door) -> None:
        self.door = door

    def collect(self) -> Iterable[Metric]:
        for name, value, text in (
            ("keylane_door_kept", self.door.kept, "Refused deliveries kept (door streams)."),
            (
                "keylane_door_keep_failures",
                self.door.failed + self.door.dropped,
                "Refused deliveries that could not be kept (Redis refused, or too many "
                "waiting to be written).",
            ),
        ):
            metric = CounterMetricFamily(name, text)
            metric.add_metric([], value)
            yield metric
