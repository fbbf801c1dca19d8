"""What ``import keylane`` gives user code, as behaviour: registering tasks and sending them
events, registering scheduled jobs and repairs, pointing the process at a deployment,
opening a resource for a task.

The names are re-exported by :mod:`keylane`; this module holds what they do. It sits on top
of the house (it may use producers, workers and ops, and nothing inside keylane imports it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .ops.embedded_redis import with_embedded_redis
from .producers.runs import Run
from .producers.sender import Sender, Sent
from .routing.contract.destinations import TASK_PREFIX
from .routing.contract.errors import (
    ConfigError,
    InvalidEvent,
)
from .routing.contract.events import Event
from .routing.contract.identities import check_identities
from .routing.contract.schedules import DEFAULT_OVERLAP, job_spec
from .routing.contract.settings import Settings
from .routing.contract.settings_env import load_settings
from .routing.contract.sources import load_sources
from .workers.destinations import Context
from .workers.jobs import register_job
from .workers.resource import (
    VersionedResource,
)
from .workers.resources import open_resource
from .workers.store_rows import Record
from .workers.tasks import KeyRule, TaskSpec, register

#: What a task function looks like: it gets the event and its context, and returns
#: (or raises) an outcome; returning None means done. A batch task (``batch=N``) gets a
#: list of its record's waiting events instead, in order, and its outcome is theirs.
TaskFunction = Callable[[Event, Context], Any] | Callable[[list[Event], Context], Any]

_lock = threading.Lock()
_sender: Sender | None = None
_settings: Settings | None = None


def configure(**settings: Any) -> None:
    """Point ``send`` at a deployment (``redis_url=...``, ``namespace=...``, any setting);
    without it, the ``KEYLANE_*`` environment decides, as for the ``keylane`` command."""
    global _sender, _settings
    with _lock:
        if _sender is not None:
            _sender.close()
        _sender, _settings = None, with_embedded_redis(load_settings(**settings))


def _get_sender() -> Sender:
    global _sender
    with _lock:
        if _sender is None:
            _sender = Sender(_settings or with_embedded_redis(load_settings()))
        return _sender


class Task:
    """A registered task: call it like the function, or ``send`` it an event."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.__doc__ = spec.fn.__doc__
        self.__wrapped__ = spec.fn

    def __call__(self, event: Event | list[Event], context: Context) -> Any:
        return self.spec.fn(event, context)

    def __repr__(self) -> str:
        return f"<keylane task {self.name}>"

    @property
    def destination(self) -> str:
        """The destination its events go to: its own, or ``task:<name>``."""
        return self.spec.destination or f"{TASK_PREFIX}{self.name}"

    def send(
        self,
        payload: Any,
        *,
        event_id: str | None = None,
        event_type: str = "event",
        wait: float | None = None,
        also: list[str] | tuple[str, ...] = (),
    ) -> Sent:
        """Queue ``payload`` for this task, on the lane of its record key. With an
        ``event_id``, a second send of the same id is a duplicate and runs nothing (the
        receiver's dedupe); ``InvalidEvent`` if that id came with another payload. With
        ``wait`` (seconds), the task's outcome once its lane decided it: ``applied`` with
        what it returned (``result``), ``refused`` (``keylane.Refuse``: ``reason``) or
        ``dead_lettered``; ``accepted`` if not decided in time (ops/docs/outcomes.md).
        ``also``: the record's other identities (``"phone:+44 20 7946 0958"``), for a task
        registered with ``on_merge``."""
        fields = self.event_fields(payload, event_id, event_type, also)
        return _get_sender().send(wait=wait, **fields)

    async def send_async(
        self,
        payload: Any,
        *,
        event_id: str | None = None,
        event_type: str = "event",
        wait: float | None = None,
        also: list[str] | tuple[str, ...] = (),
    ) -> Sent:
        """:meth:`send` for async code."""
        fields = self.event_fields(payload, event_id, event_type, also)
        return await _get_sender().send_async(wait=wait, **fields)

    def event_fields(
        self,
        payload: Any,
        event_id: str | None,
        event_type: str,
        also: list[str] | tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """The fields of the event that carries ``payload`` to this task (what
        :meth:`send` queues; a scheduled run's ``run.send(task, payload)`` too)."""
        if also and self.spec.on_merge is None:
            raise InvalidEvent(
                f"task {self.name}: also (identities) needs a task registered with on_merge "
                "(keylane cannot merge records elsewhere without it)"
            )
        try:
            record_key = self.spec.record_key(payload)
            identities = check_identities(list(also))
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
        return {
            "source": self.name,
            "destination": self.destination,
            "payload": payload,
            "record_key": record_key,
            "event_id": event_id,
            "event_type": event_type,
            "batch": self.spec.batch,
            "identities": identities,
        }


def change(
    source: str,
    record_key: str,
    changes: dict[str, Any],
    *,
    event_id: str | None = None,
    conditions: dict[str, Any] | None = None,
    if_revision: int | None = None,
    wait: float | None = None,
) -> Sent:
    """Change one of keylane's records through its lane, as ``source`` (a source of the
    sources file, whose fields it must own; ``demo`` without one), as a delivery of
    keylane's envelope would: ``changes`` (``{"owner": {"set": "ada"}}``), and
    ``conditions`` / ``if_revision`` that must hold for it to apply (ops/docs/conditions.md;
    a malformed one is ``InvalidEvent``). With ``wait`` (seconds), its outcome: ``applied``
    (``revision``, ``result``), ``refused`` (``reason`` ``condition_unmet``, ``result``
    saying which condition and the value seen) or ``dead_lettered``; ``accepted`` if not
    decided in time. Deduplicated on ``(source, event_id)``, as deliveries are::

        booked = keylane.change("demo", "slot:7", {"owner": {"set": "ada"}},
                                event_id="book-7-ada",
                                conditions={"owner": {"absent": True}}, wait=10)
        booked.status  # "applied", or "refused" when another owner was there first
    """
    return _get_sender().send(
        source=source,
        destination=None,
        payload=None,
        record_key=record_key,
        event_id=event_id,
        changes=changes,
        conditions=conditions,
        if_revision=if_revision,
        wait=wait,
    )


_resources = threading.local()


def resource(name: str) -> VersionedResource:
    """The version-checked destination ``name`` (an ``etag``, ``pg_table`` or ``stamped``
    ``[destinations.X]`` of the sources file), opened for this thread, for a task to write
    through :func:`apply_versioned`::

        crm = keylane.resource("crm")
        keylane.apply_versioned(crm, event.record_key, {"plan": keylane.Change(op="set", value=p)})
    """
    opened: dict[str, VersionedResource] = _resources.__dict__.setdefault("by_name", {})
    if name not in opened:
        config = load_sources(_settings or load_settings()).destinations.get(name)
        if config is None or config.resource is None:
            raise ConfigError(f"no version-checked [destinations.{name}] in the sources file")
        opened[name] = open_resource(config.resource)
    return opened[name]


def task(
    key: KeyRule,
    *,
    name: str | None = None,
    destination: str | None = None,
    batch: int = 1,
    debounce_ms: int = 0,
    on_merge: TaskFunction | None = None,
) -> Callable[[TaskFunction], Task]:
    """Register a function as a keylane task.

    ``key`` derives the record key from a payload: a template over its top-level fields
    (``"contact:{email}"``) or a function. ``name`` defaults to the function's name; a
    source's ``task = "..."`` refers to it. ``destination`` names a ``[destinations.X]``
    table of ``kind = "task"`` whose limits (calls in flight, calls per second) apply.

    ``batch=N`` (N > 1): the function is given a list of its record's waiting events (1 to
    N, in order) instead of one event, and what it returns or raises is the outcome of them
    all: one call to the system it writes to for a burst of edits. ``debounce_ms=D`` (with a
    batch): the lane waits until the record's newest waiting event is D ms old, or N are
    waiting, before it calls the function. A source that names the task sets ``batch = N``
    too (the receiver marks its events so that a lane can take them together).

    ``on_merge``: a function ``(event, context)`` that merges two of the task's records
    where they are (the CRM's merge). With it, the task's events may name identities (a
    source's ``also``, ``send(..., also=[...])``); when an identity names two keys, keylane
    merges their lanes (the older key survives; later events of the other run in the
    survivor's lane, as ``event.record_key`` the survivor and ``event.via`` the key they
    were sent to) and calls ``on_merge`` once, in the survivor's lane, with
    ``event.merge.survivor`` and ``event.merge.absorbed`` (ops/docs/identities.md).
    """

    def decorate(fn: TaskFunction) -> Task:
        return Task(register(fn, key, name, destination, batch, debounce_ms, on_merge))

    return decorate


#: What a scheduled job looks like: it gets its run, and sends events through it.
JobFunction = Callable[[Run], Any]
#: What a repair's check looks like: a record -> the change that repairs it, or None.
RepairCheck = Callable[[Record], "dict[str, Any] | None"]


def schedule(
    *,
    every: int | float | timedelta | str | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    name: str | None = None,
    overlap: str = DEFAULT_OVERLAP,
    on_interrupted: str = "rerun",
    owns: list[str] | tuple[str, ...] = (),
    source: str | None = None,
) -> Callable[[JobFunction], JobFunction]:
    """Register a function as a scheduled job, called with a :class:`Run` at each tick.

    ``every``: an interval (``"5m"``, ``300``, ``timedelta(minutes=5)``; ticks at the
    multiples of it since the epoch, UTC), or ``cron`` (five fields) with an explicit
    ``timezone`` (``"Europe/Paris"``, ``"UTC"``). ``overlap``: what a tick that comes while
    the previous run still runs becomes — ``"skip"`` (the default: counted, logged, and
    covered by the next run's ``run.since``) or ``"buffer_one"`` (it runs right after, at
    most one waits; more are skipped). ``on_interrupted``: a run whose scheduler died is
    run again (``"rerun"``, the default; its events keep their ids, so nothing has a second
    effect) or counted and left (``"skip"``). ``owns``: the fields of keylane's records its
    ``run.change(...)`` may set (its events come from a source named after the job), or
    ``source``: a source of the sources file whose rules they follow instead.
    """

    def decorate(fn: JobFunction) -> JobFunction:
        spec = job_spec(
            fn,
            "job",
            name,
            every=every,
            cron=cron,
            timezone=timezone,
            overlap=overlap,
            on_interrupted=on_interrupted,
            owns=tuple(owns),
            source=source,
        )
        register_job(spec)
        return fn

    return decorate


def repair(
    *,
    owns: list[str] | tuple[str, ...],
    every: int | float | timedelta | str | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    name: str | None = None,
    prefix: str = "",
    overlap: str = DEFAULT_OVERLAP,
) -> Callable[[RepairCheck], RepairCheck]:
    """Register a check as a repair: given a record of keylane's store, it returns the
    change that repairs it (``{"domain": {"set": "example.com"}}``, fields of ``owns``
    only), or None when the record is fine.

    A sweep (at the schedule's ticks, and ``keylane repair NAME``) reads the records whose
    keys start with ``prefix`` and sends a repair event into the lane of each record the
    check would change. The sweep never writes: in the lane, behind the record's other
    events, the check runs again on the record as freshly read, and what it returns then
    is applied (nothing, if the record was fixed meanwhile), revision-checked. The worker
    must import the check's module too (``-A``).
    """

    def decorate(check: RepairCheck) -> RepairCheck:
        spec = job_spec(
            check,
            "repair",
            name,
            every=every,
            cron=cron,
            timezone=timezone,
            overlap=overlap,
            owns=tuple(owns),
            prefix=prefix,
        )
        register_job(spec)
        return check

    return decorate
