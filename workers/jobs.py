"""The registry of scheduled jobs and repairs in this process, and the user code it loads.

``@keylane.schedule`` and ``@keylane.repair`` register a job when the app module that
declares it is imported (``-A``); a sources file's ``[schedules.<name>]`` and
``[repairs.<name>]`` tables name their functions (``module:function``), imported and
registered by :func:`scheduled_jobs`. A worker finds a repair's check here again when the
repair event reaches the record's lane (:func:`recheck`); the scheduler process (``ops``)
collects the jobs it runs from here. What a job is (its timing, its checks, its event ids)
is the contract's: :mod:`keylane.routing.contract.schedules`.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from ..routing.contract.errors import ConfigError
from ..routing.contract.schedules import JobSpec
from ..routing.contract.sources import Sources

_JOBS: dict[str, JobSpec] = {}


def register_job(spec: JobSpec) -> JobSpec:
    """Register ``spec`` in this process (a second registration of the same function, as
    when a module is imported twice, is fine; two functions under one name are not)."""
    existing = _JOBS.get(spec.name)
    if existing is not None and existing.origin != spec.origin:
        raise ConfigError(f"two jobs are named {spec.name}: {existing.origin}, {spec.origin}")
    _JOBS[spec.name] = spec
    return spec


def registered_jobs() -> list[JobSpec]:
    """Every job registered in this process, by name."""
    return [_JOBS[name] for name in sorted(_JOBS)]


def registered_job(name: str) -> JobSpec | None:
    """The job called ``name``, if registered in this process."""
    return _JOBS.get(name)


def scheduled_jobs(sources: Sources) -> list[JobSpec]:
    """Every scheduled job and repair of this process: those registered with
    ``@keylane.schedule`` / ``@keylane.repair`` (import the app modules first) and the
    sources file's, whose functions are imported and registered here."""
    for config in sources.jobs:
        register_job(config.spec(import_function(f"job {config.name}", config.function)))
    return registered_jobs()


#: The handler of every repair's source: the lane calls it with the repair event and the
#: record as freshly read, and it asks the repair's check again (``Sources.with_jobs``).
RECHECK_HANDLER = "keylane.workers.jobs:recheck"


def recheck(event: Any, record: Any) -> Mapping[str, Any] | None:
    """The lane's side of a repair: the check again, on the record as the lane reads it
    (after every event before the repair event in the record's lane), and the change it
    returns now — None if the record no longer needs repairing."""
    spec = registered_job(str(event.source))
    if spec is None or spec.kind != "repair":
        raise ConfigError(f"no repair named {event.source} is registered in this worker")
    return spec.fn(record)  # type: ignore[no-any-return]


def import_function(what: str, path: str) -> Callable[..., Any]:
    """``module:function`` from the user's code, imported; ``ConfigError`` names ``what``
    it is for (``job nightly``, ``source crm: handler``) and why it cannot be."""
    try:
        fn = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot load {path}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"{what}: {path} is not callable")
    return fn  # type: ignore[no-any-return]
