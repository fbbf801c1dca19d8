"""A destination that runs a registered user task (see :mod:`keylane.workers.tasks`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ...routing.contract.destinations import (
    EXCERPT_CHARS,
    DestinationConfig,
    task_destination,
)
from ...routing.contract.errors import ConfigError
from ...routing.contract.events import Event
from ..tasks import TaskSpec, all_tasks, registered
from . import Blocking, Context, Destination, Done, Outcome


class TaskDestination(Destination):
    """Calls ``task(event, context)`` (or awaits it) — a batch task with a list of events
    instead, and the task's ``on_merge`` with a merge's absorb; what it returns or raises
    is the outcome."""

    def __init__(self, config: DestinationConfig) -> None:
        super().__init__(config)
        assert config.task is not None
        self.spec: TaskSpec = _task(config.name, config.task)
        self.batch = self.spec.batch
        self.debounce_s = self.spec.debounce_ms / 1000
        self.merges = self.spec.on_merge is not None

    def _function(self, given: Event | list[Event]) -> Callable[..., Any]:
        """The task's function, or its ``on_merge`` for a merge's event."""
        if isinstance(given, Event) and given.merge is not None:
            assert self.spec.on_merge is not None
            return self.spec.on_merge
        return self.spec.fn

    async def call(self, event: Event, context: Context, blocking: Blocking) -> Outcome:
        """Run the task once (see :meth:`_run`)."""
        return await self._run(event, context, blocking)

    async def call_batch(
        self, events: list[Event], context: Context, blocking: Blocking
    ) -> Outcome:
        """Run a batch task once with ``events`` (see :meth:`_run`)."""
        return await self._run(events, context, blocking)

    async def _run(
        self, given: Event | list[Event], context: Context, blocking: Blocking
    ) -> Outcome:
        """An ``async def`` task runs on the lane's loop (waiting holds no thread), a
        plain one in the lanes' thread pool."""
        fn = self._function(given)
        if not inspect.iscoroutinefunction(fn):
            outcome: Outcome = await blocking(self._run_blocking, given, context)
            return outcome
        try:
            result = await fn(given, context)
        except Outcome as outcome:
            return outcome
        return _outcome(result)

    def call_blocking(self, event: Event, context: Context) -> Outcome:
        """Run a plain task once, blocking (see :meth:`_run_blocking`)."""
        return self._run_blocking(event, context)

    def _run_blocking(self, given: Event | list[Event], context: Context) -> Outcome:
        """An :class:`Outcome` the task raises or returns is the outcome; ``None`` or any
        other value is :class:`Done` (the value kept as the response)."""
        try:
            result = self._function(given)(given, context)
        except Outcome as outcome:
            return outcome
        return _outcome(result)

    def describe(self, event: Event, context: Context) -> dict[str, Any]:
        """The task and what it was given."""
        fn = self._function(event)
        given = {"payload": event.payload}
        if event.merge is not None:
            given = {"merge": {"survivor": event.merge.survivor, "absorbed": event.merge.absorbed}}
        return {
            "task": self.spec.name,
            "function": f"{fn.__module__}.{fn.__qualname__}",
            **given,
            "idempotency_key": context.idempotency_key,
        }


def _outcome(result: Any) -> Outcome:
    if isinstance(result, Outcome):
        return result
    if result is None:
        return Done()
    return Done(response=repr(result)[:EXCERPT_CHARS], result={"returned": result})


def _task(destination: str, name: str) -> TaskSpec:
    spec = registered(name)
    if spec is None:
        known = ", ".join(t.name for t in all_tasks()) or "none"
        raise ConfigError(
            f"destination {destination}: no task named {name!r} is registered (registered: "
            f"{known}); is the module that defines it given with -A / KEYLANE_APP?"
        )
    return spec


def task_destinations(configs: Mapping[str, DestinationConfig]) -> list[DestinationConfig]:
    """One destination per registered task that has none in ``configs`` (what
    ``task.send(...)`` targets), after checking each task's own ``destination``."""
    out = []
    for spec in all_tasks():
        if spec.destination is not None:
            config = configs.get(spec.destination)
            if config is None or config.task != spec.name:
                raise ConfigError(
                    f"task {spec.name}: destination {spec.destination!r} must be a "
                    f'[destinations.{spec.destination}] with kind = "task", task = "{spec.name}"'
                )
        implied = task_destination(spec.name)
        if implied.name not in configs:
            out.append(implied)
    return out
