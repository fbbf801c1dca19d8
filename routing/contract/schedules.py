"""Scheduled jobs: when they run, what becomes of a tick that cannot run at its time, and
what a job is. The registry of a process's jobs, and the import of the functions a
sources file names, are the worker side's (:mod:`keylane.workers.jobs`).

A job runs at the ticks of its timing: an interval (``every="5m"``: multiples of five
minutes since the Unix epoch, in UTC, so every scheduler process computes the same ticks)
or a cron expression in an explicit time zone (``cron="0 3 * * *",
timezone="Europe/Paris"``; parsed by cronsim, with Debian cron's behaviour at daylight
saving changes: a time that does not exist runs right after the change, a time that
exists twice runs once). A tick is identified by its scheduled time; the events of a run
carry ids derived from the job, that time and the record (:func:`event_id`), so running
a tick again has no second effect.

Three kinds of job share this module, each a :class:`JobSpec`:

* ``job``: a user function given the run (``@keylane.schedule``, or ``[schedules.<name>]``
  in the sources file);
* ``repair``: a user check given a record, run over keylane's store by a sweep that emits a
  repair event into each matching record's lane; the lane calls the check again on the
  fresh read (``keylane.workers.jobs.recheck``) and applies what it returns then
  (``@keylane.repair``, or ``[repairs.<name>]``);
* ``builtin``: keylane's own maintenance (a plain callable given the run, no events),
  registered by ``ops`` with :func:`builtin_job`.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field

from .errors import ConfigError
from .events import MAX_ID_CHARS

Overlap = Literal["skip", "buffer_one"]
OnInterrupted = Literal["rerun", "skip"]
JobKind = Literal["job", "repair", "builtin"]

#: The default overlap policy: a tick that comes while the job's previous run still runs
#: is skipped, counted and logged (Temporal's default too). A job that pulls "changed
#: since ``run.since``" loses nothing by it: its next run covers the skipped interval.
DEFAULT_OVERLAP: Overlap = "skip"

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_EVERY = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: Ticks counted one by one when a scheduler comes back after a long absence; beyond,
#: the count of missed ticks is a lower bound.
MAX_COUNTED_TICKS = 100_000


def parse_every(every: int | float | timedelta | str) -> int:
    """An interval in whole seconds (``300``, ``timedelta(minutes=5)``, ``"5m"``,
    ``"90s"``, ``"1h"``, ``"1d"``); ``ConfigError`` when it is not one."""
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, str):
        match = _EVERY.match(every)
        if match is None:
            raise ConfigError(f"every={every!r}: write a number and s, m, h or d (e.g. '5m')")
        seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        seconds = every
    if seconds < 1 or seconds != int(seconds):
        raise ConfigError(f"every={every!r}: an interval is a whole number of seconds, >= 1")
    return int(seconds)


@dataclass(frozen=True)
class Timing:
    """When a job's ticks fall: every ``every_s`` seconds, or at a cron expression's
    times in ``timezone``. Times are milliseconds since the epoch."""

    every_s: int | None = None
    cron: str | None = None
    timezone: str | None = None

    @classmethod
    def of(
        cls,
        every: int | float | timedelta | str | None = None,
        cron: str | None = None,
        timezone: str | None = None,
    ) -> Timing | None:
        """The timing given by a decorator's or a table's arguments (None: no schedule,
        the job runs only when asked); ``ConfigError`` says what is wrong."""
        if every is not None and cron is not None:
            raise ConfigError("a job runs every=... or at cron=..., not both")
        if every is not None:
            if timezone is not None:
                raise ConfigError("an interval needs no timezone (it counts from the epoch, UTC)")
            return cls(every_s=parse_every(every))
        if cron is None:
            if timezone is not None:
                raise ConfigError("timezone goes with cron=...")
            return None
        if timezone is None:
            raise ConfigError(f"cron={cron!r} needs an explicit timezone= (e.g. 'UTC')")
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"unknown time zone {timezone!r}") from None
        if len(cron.split()) != 5:
            raise ConfigError(f"cron={cron!r}: five fields (minute hour day month weekday)")
        try:
            CronSim(cron, datetime.now(zone))
        except CronSimError as exc:
            raise ConfigError(f"cron={cron!r}: {exc}") from None
        return cls(cron=cron, timezone=timezone)

    def describe(self) -> str:
        """``every 300s`` or ``cron 0 3 * * * (Europe/Paris)``."""
        if self.every_s is not None:
            return f"every {self.every_s}s"
        return f"cron {self.cron} ({self.timezone})"

    def after(self, ms: int) -> int:
        """The first tick strictly after ``ms``."""
        if self.every_s is not None:
            step = self.every_s * 1000
            return (ms // step + 1) * step
        assert self.cron is not None
        assert self.timezone is not None
        start = datetime.fromtimestamp(ms / 1000, ZoneInfo(self.timezone))
        return int(next(CronSim(self.cron, start)).timestamp() * 1000)

    def due(self, last_ms: int, now_ms: int) -> tuple[int | None, int]:
        """The latest tick in ``(last_ms, now_ms]`` and how many ticks came before it in
        that span (missed: no scheduler ran them at their time); ``(None, 0)`` if none."""
        first = self.after(last_ms)
        if first > now_ms:
            return None, 0
        if self.every_s is not None:
            step = self.every_s * 1000
            latest = now_ms // step * step
            return latest, (latest - first) // step
        tick, count = first, 0
        while count < MAX_COUNTED_TICKS:
            following = self.after(tick)
            if following > now_ms:
                return tick, count
            tick, count = following, count + 1
        # A long absence: find the latest tick from a month back, counting no further.
        following = self.after(max(tick, now_ms - 31 * 86400 * 1000))
        while following <= now_ms:
            tick, following = following, self.after(following)
        return tick, count


def tick_text(ms: int) -> str:
    """A tick as it appears in event ids and listings: ISO 8601 in UTC
    (``2026-12-02T15:30:00Z``; milliseconds only when it has them)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


def event_id(job: str, tick_ms: int, record_key: str) -> str:
    """The id of job ``job``'s event for ``record_key`` in its run of ``tick_ms``: the
    same every time that tick runs, so a repeated run has no second effect
    (``pull_contacts@2026-12-02T15:30:00Z/contact:42``; a key too long for an id is
    replaced by its SHA-256)."""
    base = f"{job}@{tick_text(tick_ms)}/"
    if len(base) + len(record_key) <= MAX_ID_CHARS:
        return base + record_key
    return base + "sha256:" + hashlib.sha256(record_key.encode()).hexdigest()


@dataclass(frozen=True)
class RunLease:
    """The lease a run holds while it runs: only while its value is still in ``key`` are
    the run's events accepted (see ``ACCEPT_FENCED``)."""

    job: str
    key: str
    value: str


class RecordLike(Protocol):
    """What a repair's check is given: a record as read from keylane's store."""

    @property
    def key(self) -> str: ...

    @property
    def fields(self) -> dict[str, Any]: ...

    @property
    def revision(self) -> int: ...


#: A repair's check: the record (as the sweep read it, then as the lane reads it fresh)
#: -> the change that repairs it (``{"field": {"set": v}}``), or None when it is fine.
RepairCheck = Callable[[Any], "Mapping[str, Any] | None"]
#: What a sweep reads: (key prefix, the last key of the previous page, page size) ->
#: the next records in key order.
RecordReader = Callable[[str, str, int], "list[Any]"]


@dataclass(frozen=True)
class JobSpec:
    """A scheduled job (see the module docstring)."""

    name: str
    kind: JobKind
    fn: Callable[..., Any]
    timing: Timing | None
    overlap: Overlap = DEFAULT_OVERLAP
    on_interrupted: OnInterrupted = "rerun"
    owns: tuple[str, ...] = ()  # the fields its events change, as its own source
    source: str | None = None  # a configured source its events come from instead
    prefix: str = ""  # a repair sweeps the records whose keys start with this
    origin: str = field(default="", compare=False)

    @property
    def source_name(self) -> str | None:
        """The source of its events to keylane's records (None: it has none)."""
        if self.source is not None:
            return self.source
        return self.name if self.owns else None

    def definition(self) -> dict[str, Any]:
        """What ``keylane schedules`` shows of it."""
        return {
            "kind": self.kind,
            "timing": self.timing.describe() if self.timing else "on demand",
            "overlap": self.overlap,
            "on_interrupted": self.on_interrupted,
            "source": self.source_name,
        }


def job_spec(
    fn: Callable[..., Any],
    kind: JobKind,
    name: str | None = None,
    every: int | float | timedelta | str | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    overlap: str = DEFAULT_OVERLAP,
    on_interrupted: str = "rerun",
    owns: tuple[str, ...] | list[str] = (),
    source: str | None = None,
    prefix: str = "",
) -> JobSpec:
    """A checked :class:`JobSpec` (``ConfigError`` says what is wrong)."""
    job = str(name or getattr(fn, "__name__", ""))
    if not _NAME.match(job):
        raise ConfigError(f"job names are lowercase [a-z0-9_.-], 1..64 chars: {job!r}")
    if (kind == "builtin") != job.startswith("keylane."):
        raise ConfigError(f"job {job}: names starting with 'keylane.' are keylane's own jobs")
    if overlap not in ("skip", "buffer_one"):
        raise ConfigError(f"job {job}: overlap is 'skip' or 'buffer_one', not {overlap!r}")
    if on_interrupted not in ("rerun", "skip"):
        raise ConfigError(f"job {job}: on_interrupted is 'rerun' or 'skip'")
    timing = Timing.of(every, cron, timezone)
    if timing is None and kind != "repair":
        raise ConfigError(f"job {job}: give every=... or cron=... with timezone=...")
    if kind == "repair":
        if not owns or source is not None:
            raise ConfigError(f"repair {job}: owns=[...] names the fields it may repair")
        if inspect.iscoroutinefunction(fn):
            raise ConfigError(f"repair {job}: the check is a plain function (def, not async)")
    if source is not None and owns:
        raise ConfigError(f"job {job}: owns=... or source=..., not both")
    return JobSpec(
        name=job,
        kind=kind,
        fn=fn,
        timing=timing,
        overlap=overlap,  # type: ignore[arg-type]
        on_interrupted=on_interrupted,  # type: ignore[arg-type]
        owns=tuple(owns),
        source=source,
        prefix=prefix,
        origin=f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
    )


def builtin_job(
    name: str,
    fn: Callable[..., Any],
    every: int | float | timedelta | str | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    overlap: str = DEFAULT_OVERLAP,
) -> JobSpec:
    """One of keylane's own maintenance jobs (named ``keylane.<what>``): ``fn(run)`` is
    called at each tick, under the job's lease like any job (one runner at a time, never
    overlapping itself, a standby taking over); it sends no events. ``run.check()``
    raises :class:`~keylane.routing.contract.errors.LeaseLost` once the lease is gone
    (call it between batches of work); ``run.token`` grows with every run, for a job
    that fences its own writes."""
    return job_spec(fn, "builtin", name, every, cron, timezone, overlap)


# -- the sources file ------------------------------------------------------------------


class ScheduleConfig(BaseModel):
    """A ``[schedules.<name>]`` table: ``run = "module:function"`` and its timing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    run: str = Field(pattern=r"^[\w.]+:\w+$")
    every: str | int | None = None
    cron: str | None = None
    timezone: str | None = None
    overlap: Overlap = DEFAULT_OVERLAP
    on_interrupted: OnInterrupted = "rerun"
    owns: tuple[str, ...] = ()
    source: str | None = None

    @property
    def function(self) -> str:
        """The ``module:function`` it runs."""
        return self.run

    def spec(self, fn: Callable[..., Any]) -> JobSpec:
        """The job, ``fn`` being its function as imported (``ConfigError`` says what is
        wrong)."""
        return job_spec(
            fn,
            "job",
            self.name,
            every=self.every,
            cron=self.cron,
            timezone=self.timezone,
            overlap=self.overlap,
            on_interrupted=self.on_interrupted,
            owns=self.owns,
            source=self.source,
        )


class RepairConfig(BaseModel):
    """A ``[repairs.<name>]`` table: ``check = "module:function"``, the fields it owns,
    and (optionally) when its sweep runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    check: str = Field(pattern=r"^[\w.]+:\w+$")
    owns: tuple[str, ...]
    prefix: str = ""
    every: str | int | None = None
    cron: str | None = None
    timezone: str | None = None
    overlap: Overlap = DEFAULT_OVERLAP

    @property
    def function(self) -> str:
        """The ``module:function`` of its check."""
        return self.check

    def spec(self, fn: Callable[..., Any]) -> JobSpec:
        """The repair, ``fn`` being its check as imported (``ConfigError`` says what is
        wrong)."""
        return job_spec(
            fn,
            "repair",
            self.name,
            every=self.every,
            cron=self.cron,
            timezone=self.timezone,
            overlap=self.overlap,
            owns=self.owns,
            prefix=self.prefix,
        )
