"""The scheduler process (``keylane scheduler``, started by ``keylane up``) and the runs
asked for by hand (``keylane run``, ``keylane repair``): the deployment's jobs (the app's,
the sources file's and keylane's own) and the store reads a repair sweep needs.

keylane's own maintenance jobs are registered in :func:`builtin_jobs`: each is a plain
callable given the run, scheduled like any job (one runner at a time, never overlapping
itself, a standby scheduler taking over), and sends no events.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from ..producers.runs import Run
from ..producers.scheduler import RunReport, Scheduler
from ..routing.contract.errors import ConfigError
from ..routing.contract.schedules import JobSpec, RecordReader, builtin_job
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources, load_sources
from ..workers.jobs import RECHECK_HANDLER, scheduled_jobs
from ..workers.stores import open_store
from ..workers.tasks import import_app
from .retention import run_prune


def builtin_jobs(settings: Settings) -> list[JobSpec]:
    """keylane's own maintenance jobs (:func:`~keylane.routing.contract.schedules.builtin_job`):
    the journal's prune every ``prune_every_s`` (docs page "Retention and the archive",
    ops/docs/retention.md)."""
    if not settings.prune_every_s:
        return []
    return [
        builtin_job(
            PRUNE_JOB, lambda run: prune_as_job(settings, run), every=settings.prune_every_s
        )
    ]


#: The scheduled prune's name, as `keylane schedules` lists it.
PRUNE_JOB = "keylane.journal-prune"


def prune_as_job(settings: Settings, run: Run) -> None:
    """One run of the prune under its job's lease: between batches it checks the lease is
    still the run's (a run taken over stops; the next one finishes the job, as after a
    crash)."""
    report = run_prune(settings, progress=lambda *_: run.check())
    if report.skipped:
        run.log.info("another prune of this store is running; this tick does nothing")


def deployment_jobs(settings: Settings) -> tuple[list[JobSpec], Sources]:
    """Every job of the deployment (the app modules imported first), and the sources
    their events are looked up in (``ConfigError`` when one cannot work)."""
    import_app(settings.app_modules)
    configured = load_sources(settings)
    jobs = scheduled_jobs(configured) + builtin_jobs(settings)
    return jobs, configured.with_jobs(jobs, RECHECK_HANDLER)


def store_reader(settings: Settings) -> RecordReader:
    """What a repair sweep reads: a page of records in key order, each page on a store
    connection of its own (a sweep holds no transaction between pages)."""

    def read(prefix: str, after: str, limit: int) -> list[Any]:
        store = open_store(settings.store_dsn(), settings.store_timeout_ms)
        try:
            return list(store.scan_records(prefix, after, limit))
        finally:
            store.close()

    return read


def run_scheduler(settings: Settings) -> None:
    """Run a scheduler until SIGTERM or SIGINT (the runs in progress finish first)."""
    jobs, sources = deployment_jobs(settings)
    scheduler = Scheduler(settings, jobs, sources, store_reader(settings))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await scheduler.serve(stop)
        finally:
            await scheduler.close()

    asyncio.run(main())


def run_job_now(settings: Settings, name: str, kind: str | None = None) -> RunReport:
    """Run job ``name`` once now, under its lease (``kind``: it must be of that kind)."""
    jobs, sources = deployment_jobs(settings)
    job = next((j for j in jobs if j.name == name), None)
    if job is None or (kind is not None and job.kind != kind):
        names = ", ".join(j.name for j in jobs if kind is None or j.kind == kind) or "none"
        raise ConfigError(f"no {kind or 'job'} named {name!r} (known: {names}; -A imports yours)")
    scheduler = Scheduler(settings, [job], sources, store_reader(settings))

    async def main() -> RunReport:
        try:
            return await scheduler.run_now(name)
        finally:
            await scheduler.close()

    return asyncio.run(main())


def repair_candidates(settings: Settings, name: str) -> list[dict[str, Any]]:
    """What a sweep of repair ``name`` would send now, without sending it: the records
    its check would change, with the change (``keylane repair --dry-run``)."""
    jobs, _ = deployment_jobs(settings)
    job = next((j for j in jobs if j.name == name and j.kind == "repair"), None)
    if job is None:
        raise ConfigError(f"no repair named {name!r} (-A imports yours)")
    read, after, found = store_reader(settings), "", []
    while True:
        page = read(job.prefix, after, 500)
        for record in page:
            wanted = job.fn(record)
            if wanted:
                found.append(
                    {"record_key": record.key, "revision": record.revision, "change": dict(wanted)}
                )
        if len(page) < 500:
            return found
        after = page[-1].key
