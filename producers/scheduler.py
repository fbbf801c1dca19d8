"""The scheduler: runs scheduled jobs at their ticks, one run of a job at a time, in any
number of processes at once (``keylane scheduler``; ``keylane up`` starts one).

Every process steps every job (:meth:`ScheduleGateway.step`, one Redis script) when a
tick falls due and at least once per heartbeat. The step decides atomically, for all the
processes, what becomes of the tick (run, buffered, skipped, missed: each counted and
logged) and which process runs it: the one whose step starts the run takes the job's
lease (owner token, TTL, a fencing token that grows with every run). The run's heartbeat
renews the lease; the run's events are accepted only while it holds it. A scheduler that
dies or pauses loses the lease after its TTL; the next step of any other process finds
the run interrupted and, by the job's ``on_interrupted`` policy, runs the same tick again
(``rerun``, the default: its events have the same ids, so what the first attempt sent
has no second effect) or lets it go (``skip``). No two runs of a job ever hold the
lease at once, and a run that lost it can send nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sentry_sdk

from ..routing.contract.errors import BrokerUnavailable, LeaseLost
from ..routing.contract.schedules import JobSpec, RecordReader, RunLease
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from .gateway import ScheduleGateway, StepReply
from .runs import Run, RunInfo
from .sender import Sender
from .sweeps import sweep

log = logging.getLogger("keylane.scheduler")

#: How long a stopping scheduler waits for its runs before it gives their leases up.
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class RunReport:
    """How a run ended: ``ok``, ``failed``, ``lost`` (its lease went first) or, for a run
    asked for by hand, ``busy`` (a run of the job was going)."""

    job: str
    outcome: str
    tick_ms: int = 0
    attempt: int = 1
    sent: int = 0
    duplicates: int = 0
    error: str = ""


def new_owner_id() -> str:
    """A scheduler id unique across hosts and restarts: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Scheduler:
    """One scheduler process's loop (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        jobs: list[JobSpec],
        sources: Sources,
        read: RecordReader | None = None,
        owner: str | None = None,
    ) -> None:
        self.settings = settings
        self.jobs = {job.name: job for job in jobs}
        self.sources = sources
        self.read = read
        self.owner = owner or new_owner_id()
        self.sender = Sender(settings)
        self._gateway: ScheduleGateway | None = None
        self._last: dict[str, str] = {}
        self._next: dict[str, int | None] = {}
        self._runs: dict[asyncio.Task[Any], Run] = {}
        self._wake: asyncio.Event | None = None

    @property
    def gateway(self) -> ScheduleGateway:
        if self._gateway is None:  # made on the loop that uses it
            s = self.settings
            self._gateway = ScheduleGateway.from_url(s.redis_dsn(), s.keys)
        return self._gateway

    async def serve(self, stop: asyncio.Event) -> None:
        """Step every job at its ticks and every heartbeat until ``stop`` is set; then
        let the runs in progress finish (up to :data:`STOP_GRACE_S`)."""
        self._wake = asyncio.Event()
        await self._register()
        log.info("scheduler %s: %s job(s): %s", self.owner, len(self.jobs), ", ".join(self.jobs))
        while not stop.is_set():
            wait_s = self.settings.heartbeat_ms / 1000
            try:
                now = await self.gateway.now_ms()
                for job in self.jobs.values():
                    await self._step(job, now)
                wait_s = self._wait_s(now, wait_s)
            except BrokerUnavailable as exc:
                log.warning("scheduler cannot reach Redis: %s", exc)
            self._wake.clear()
            await _first_of(stop, self._wake, wait_s)
        await self._stop_runs()

    async def run_now(self, name: str) -> RunReport:
        """Run job ``name`` once, now, under its lease (outside its schedule: ``keylane
        run``, ``keylane repair``); ``busy`` if a run of it is going."""
        job = self.jobs[name]
        self._wake = asyncio.Event()
        now = await self.gateway.now_ms()
        await self.gateway.register(name, job.definition(), now)
        reply = await self._step_call(job, now, 0, "", mode="manual")
        if reply.kind != "start":
            return RunReport(name, "busy", error=f"a run of {name} is going ({reply.owner})")
        return await self._launch(job, reply, manual=True)

    async def close(self) -> None:
        """Close the connections."""
        if self._gateway is not None:
            await self._gateway.close()
        await asyncio.to_thread(self.sender.close)

    async def _register(self) -> None:
        now = await self.gateway.now_ms()
        for job in self.jobs.values():
            self._last[job.name] = await self.gateway.register(job.name, job.definition(), now)

    async def _step(self, job: JobSpec, now: int) -> None:
        """One step of ``job``; a run it starts here is carried out by this process."""
        reply = None
        for _ in range(3):  # another process moved the last tick on: compute again
            last = self._last.get(job.name, "0")
            due, missed = job.timing.due(int(last), now) if job.timing else (None, 0)
            reply = await self._step_call(job, due, missed, last)
            self._last[job.name] = reply.last_tick
            if reply.kind != "stale":
                break
        if reply is not None and reply.kind == "start":
            self._spawn(job, reply)
        following = job.timing.after(int(self._last[job.name])) if job.timing else None
        if following != self._next.get(job.name):
            await self.gateway.set_next(job.name, following)
            self._next[job.name] = following

    async def _step_call(
        self, job: JobSpec, due: int | None, missed: int, last: str, mode: str = "tick"
    ) -> StepReply:
        return await self.gateway.step(
            job.name,
            self.owner,
            self.settings.lease_ttl_ms,
            due,
            missed,
            last,
            job.overlap,
            job.on_interrupted,
            mode="manual" if mode == "manual" else "tick",
        )

    def _wait_s(self, now: int, poll_s: float) -> float:
        """Until the next tick of any job, at most one heartbeat (a run interrupted
        elsewhere, or a buffered tick, is found by the next step)."""
        ticks = [t for t in self._next.values() if t is not None]
        if not ticks:
            return poll_s
        return max(0.0, min(poll_s, (min(ticks) - now) / 1000))

    def _spawn(self, job: JobSpec, reply: StepReply) -> None:
        task = asyncio.create_task(self._launch(job, reply))
        task.add_done_callback(lambda _: self._wake.set() if self._wake else None)

    async def _launch(self, job: JobSpec, reply: StepReply, manual: bool = False) -> RunReport:
        info = RunInfo(job.name, reply.tick, reply.since, reply.attempt, reply.token, manual)
        lease = RunLease(
            job.name, self.settings.keys.schedule_lease(job.name), f"{self.owner}/{reply.token}"
        )
        source = self.sources.get(job.source_name) if job.source_name else None
        batch = source.batch_limit(self.settings) if source is not None else 1
        run = Run(info, lease, self.sender, job.source_name, batch)
        task = asyncio.current_task()
        assert task is not None
        self._runs[task] = run
        try:
            return await self._execute(job, run)
        finally:
            self._runs.pop(task, None)

    async def _execute(self, job: JobSpec, run: Run) -> RunReport:
        """Carry out one run: the job under its lease's heartbeat, then its end recorded."""
        run.log.info("run of %s at %s starts (attempt %s)", job.name, run.tick, run.attempt)
        heartbeat = asyncio.create_task(self._heartbeat(run, asyncio.current_task()))
        outcome, error = "ok", ""
        try:
            await self._call(job, run)
        except LeaseLost:
            run.lost = True
        except asyncio.CancelledError:
            if not run.lost:
                raise
        except Exception as exc:
            outcome, error = "failed", f"{type(exc).__name__}: {exc}"
            run.log.exception("run of %s at %s failed", job.name, run.tick)
            sentry_sdk.capture_exception(exc)
        finally:
            heartbeat.cancel()
        report = RunReport(
            job.name, outcome, run.info.tick_ms, run.attempt, run.sent, run.duplicates, error
        )
        if not run.lost:
            with contextlib.suppress(BrokerUnavailable):  # else: re-run once the lease expires
                if await self._finish(run, outcome, error):
                    return report
        run.log.warning(
            "run of %s at %s lost its lease before it ended (this scheduler paused or lost "
            "Redis); what it sent stands, and the tick is handled again by its policy",
            job.name,
            run.tick,
        )
        return RunReport(job.name, "lost", run.info.tick_ms, run.attempt, run.sent, run.duplicates)

    async def _finish(self, run: Run, outcome: str, error: str) -> bool:
        info = run.info
        finished = await self.gateway.finish(
            run.lease, info.tick_ms, info.token, outcome, error, run.sent, run.duplicates
        )
        if finished:
            run.log.info(
                "run of %s at %s: %s, %s event(s) sent (%s duplicates)",
                run.job,
                run.tick,
                outcome,
                run.sent,
                run.duplicates,
            )
        return finished

    async def _call(self, job: JobSpec, run: Run) -> None:
        if job.kind == "repair":
            if self.read is None:
                raise RuntimeError("this scheduler cannot read keylane's store")
            await in_daemon_thread(sweep, run, job, self.read)
        elif inspect.iscoroutinefunction(job.fn):
            await job.fn(run)
        else:
            await in_daemon_thread(job.fn, run)

    async def _heartbeat(self, run: Run, task: asyncio.Task[Any] | None) -> None:
        """Renew the run's lease every heartbeat; once it is gone, mark the run lost (its
        next send raises ``LeaseLost``) and cancel an ``async def`` job."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_ms / 1000)
            try:
                held = await self.gateway.renew(run.lease, self.settings.lease_ttl_ms)
            except BrokerUnavailable:
                continue
            if not held:
                run.lost = True
                if task is not None:
                    task.cancel()
                return

    async def _stop_runs(self) -> None:
        """Let the runs in progress finish; give up the leases of those that do not in
        time, so that another scheduler re-runs them at once instead of after the TTL."""
        if self._runs:
            log.info("waiting up to %ss for %s run(s) to finish", STOP_GRACE_S, len(self._runs))
            await asyncio.wait(list(self._runs), timeout=STOP_GRACE_S)
        for task, run in list(self._runs.items()):
            run.lost = True
            with contextlib.suppress(BrokerUnavailable):
                await self.gateway.release(run.lease)
            task.cancel()
            log.warning("gave up the run of %s at %s: it is run again", run.job, run.tick)


def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Call ``fn(*args)`` in a daemon thread of its own, as a future of this loop: a job
    that never returns cannot keep the process from exiting (its lease expires, and
    another scheduler runs the tick again)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="keylane-job", daemon=True).start()
    return future


async def _first_of(stop: asyncio.Event, wake: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, at most ``timeout_s``."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
