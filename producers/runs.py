"""A run of a scheduled job, as the job's function sees it: ``keylane.Run``.

A job's events go through keylane's accept path (:class:`~keylane.producers.sender.Sender`,
the receiver's own script: dedupe on the event id, the shard's high-water mark, the
record's lane; on RabbitMQ a lease check, then the confirmed publish), fenced by the
run's lease: once the lease is gone (the scheduler paused
past it, or lost Redis long enough for another to take over), nothing the run sends is
accepted and the next send raises :class:`LeaseLost`. Every event id is derived from the
job, the run's scheduled time and the record (:func:`event_id`), so a run repeated after
its scheduler died has no second effect: what the first attempt sent is a duplicate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..routing.contract.errors import InvalidEvent, LeaseLost
from ..routing.contract.events import parse_changes
from ..routing.contract.schedules import RunLease, event_id, tick_text
from .sender import Sender, Sent

log = logging.getLogger("keylane.scheduler")


class Sendable(Protocol):
    """What :meth:`Run.send` sends to: a ``keylane.task`` (its record key, destination and
    batch come from it)."""

    name: str

    def event_fields(
        self, payload: Any, event_id: str | None, event_type: str
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunInfo:
    """Which run: the job, its scheduled time (ms since the epoch), the scheduled time of
    the job's last run that finished (``since``), the attempt (2 and more: run again after
    its scheduler died) and its fencing token (grows with every run of the job)."""

    job: str
    tick_ms: int
    since_ms: int | None
    attempt: int
    token: int
    manual: bool = False


class Run:
    """One run of a scheduled job (see the module docstring). A job's function gets it::

    @keylane.schedule(every="5m", owns=["email", "plan"])
    def pull_contacts(run: keylane.Run) -> None:
        for contact in crm.changed_since(run.since):
            run.change(f"contact:{contact['id']}", {"email": {"set": contact["email"]}})
    """

    def __init__(
        self,
        info: RunInfo,
        lease: RunLease,
        sender: Sender,
        source: str | None,
        batch: int = 1,
    ) -> None:
        self.info = info
        self.lease = lease
        self._sender = sender
        self._source = source
        self._batch = batch
        self._lock = threading.Lock()
        self.lost = False
        self.sent = 0
        self.duplicates = 0
        self.log = logging.LoggerAdapter(log, {"job": info.job, "tick": self.tick})

    @property
    def job(self) -> str:
        """The job's name."""
        return self.info.job

    @property
    def tick(self) -> str:
        """The scheduled time, as it appears in event ids (``2026-12-02T15:30:00Z``)."""
        return tick_text(self.info.tick_ms)

    @property
    def scheduled_at(self) -> datetime:
        """When this run was due (UTC), whenever it actually started."""
        return datetime.fromtimestamp(self.info.tick_ms / 1000, UTC)

    @property
    def since(self) -> datetime | None:
        """The scheduled time of the job's last run that finished without error (None
        before the first): pull what changed since then, and a skipped, failed or
        interrupted run loses nothing."""
        ms = self.info.since_ms
        return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)

    @property
    def attempt(self) -> int:
        """1, or more when this tick runs again after its scheduler died mid-run."""
        return self.info.attempt

    @property
    def token(self) -> int:
        """The run's fencing token: larger for every later run of the job."""
        return self.info.token

    def event_id(self, record_key: str) -> str:
        """The id of this run's event for ``record_key`` (the same on every attempt)."""
        return event_id(self.job, self.info.tick_ms, record_key)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the run's lease is gone (call it between steps of
        long work that sends nothing)."""
        if self.lost:
            raise LeaseLost(self.job)

    def change(self, record_key: str, changes: Mapping[str, Any]) -> Sent:
        """Change one of keylane's records (``{"email": {"set": "a@b.c"}}``, the
        operations of the envelope) through its lane, as this job's source (the job
        must own the fields: ``owns=[...]``, or name a ``source=``)."""
        fields = self._change(record_key, changes)
        try:
            return self._settle(self._sender.send(**fields))
        except InvalidEvent as exc:
            return self._reused(exc, fields)

    async def change_async(self, record_key: str, changes: Mapping[str, Any]) -> Sent:
        """:meth:`change` for an ``async def`` job."""
        fields = self._change(record_key, changes)
        try:
            return self._settle(await self._sender.send_async(**fields))
        except InvalidEvent as exc:
            return self._reused(exc, fields)

    def send(self, task: Sendable, payload: Any, event_type: str = "scheduled") -> Sent:
        """Send ``payload`` to a ``keylane.task``, on the lane of its record key."""
        fields = self._task(task, payload, event_type)
        try:
            return self._settle(self._sender.send(**fields))
        except InvalidEvent as exc:
            return self._reused(exc, fields)

    async def send_async(self, task: Sendable, payload: Any, event_type: str = "scheduled") -> Sent:
        """:meth:`send` for an ``async def`` job."""
        fields = self._task(task, payload, event_type)
        try:
            return self._settle(await self._sender.send_async(**fields))
        except InvalidEvent as exc:
            return self._reused(exc, fields)

    def _change(self, record_key: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        self.check()
        if self._source is None:
            raise InvalidEvent(f"job {self.job} changes no records: give it owns=[...]")
        try:
            parse_changes(dict(changes))
        except ValueError as exc:
            raise InvalidEvent(f"job {self.job}, record {record_key}: {exc}") from None
        return {
            "source": self._source,
            "destination": None,
            "payload": None,
            "record_key": record_key,
            "event_id": self.event_id(record_key),
            "event_type": "scheduled",
            "changes": dict(changes),
            "batch": self._batch,
            "lease": self.lease,
        }

    def _task(self, task: Sendable, payload: Any, event_type: str) -> dict[str, Any]:
        self.check()
        fields = task.event_fields(payload, None, event_type)
        fields["event_id"] = self.event_id(fields["record_key"])
        return {**fields, "lease": self.lease}

    def _settle(self, sent: Sent) -> Sent:
        with self._lock:
            self.sent += 1
            self.duplicates += sent.status == "duplicate"
        return sent

    def _reused(self, exc: InvalidEvent, fields: dict[str, Any]) -> Sent:
        """An id of this tick sent before with another payload: an earlier attempt of
        this run (its scheduler died) read older data. Its event stands; the newer data
        goes with the next run, whose ``since`` is still before this tick."""
        if exc.code != "id_reused":
            raise exc
        self.log.info(
            "%s was sent by an earlier attempt of this run; it stands", fields["event_id"]
        )
        key = str(fields["record_key"])
        shard = self._sender.settings.shards.shard_for_key(key)
        return self._settle(Sent("duplicate", str(fields["event_id"]), key, shard))
