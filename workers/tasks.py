"""The registry of user tasks: ordinary Python functions a lane runs for each event of a
record, in order, one at a time.

User code registers a task with ``@keylane.task(key=...)`` in a module the worker imports
(``keylane worker -A myapp.tasks``, or ``KEYLANE_APP``); the lanes find it here by name.
A task registered with ``batch=N`` (N > 1) is given a record's waiting events together, as
a list of up to N in order, and with ``debounce_ms=D`` its lane waits until the record's
newest waiting event is D ms old (or N are waiting) before it runs it.

A task registered with ``on_merge=fn`` may be sent identities (a source's ``also``,
``task.send(..., also=[...])``): when two of its keys turn out to name one entity, keylane
merges their lanes (the older key survives, the other's later events run in the
survivor's lane) and calls ``fn(event, context)`` once, in the survivor's lane, with
``event.merge`` naming both keys, for the task to merge the records where they are
(ops/docs/identities.md).
"""

from __future__ import annotations

import importlib
import os
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..routing.contract.destinations import check_task_name
from ..routing.contract.errors import ConfigError
from ..routing.contract.settings import MAX_BATCH

#: How a record key is derived from a payload: a function, or a template such as
#: ``"contact:{email}"`` whose fields are top-level keys of the payload.
KeyRule = Callable[[Any], str] | str


@dataclass(frozen=True)
class TaskSpec:
    """A registered task."""

    name: str
    fn: Callable[..., Any]
    key: KeyRule
    destination: str | None = None  # a [destinations.<name>] of kind task, for its limits
    batch: int = 1  # > 1: called with a list of a record's waiting events, at most this many
    debounce_ms: int = 0  # a batch waits until its newest event is this old (or is full)
    #: Called with a merge step's event when two of its keys are merged (see above).
    on_merge: Callable[..., Any] | None = None

    def record_key(self, payload: Any) -> str:
        """The record key of ``payload`` (``ValueError`` when it has none)."""
        if callable(self.key):
            key = self.key(payload)
        else:
            if not isinstance(payload, Mapping):
                raise ValueError(f"task {self.name}: key {self.key!r} needs a JSON object")
            try:
                key = self.key.format_map(payload)
            except KeyError as exc:
                raise ValueError(f"task {self.name}: no {exc} in the payload") from None
        if not isinstance(key, str) or not key:
            raise ValueError(f"task {self.name}: the key is not a non-empty string: {key!r}")
        return key


_TASKS: dict[str, TaskSpec] = {}


def register(
    fn: Callable[..., Any],
    key: KeyRule,
    name: str | None = None,
    destination: str | None = None,
    batch: int = 1,
    debounce_ms: int = 0,
    on_merge: Callable[..., Any] | None = None,
) -> TaskSpec:
    """Register ``fn`` as the task ``name`` (default: the function's name)."""
    task_name = name or fn.__name__
    try:
        check_task_name(task_name)
    except ValueError as exc:
        raise ConfigError(f"{exc} (give the task a name=...)") from None
    if not 1 <= batch <= MAX_BATCH:
        raise ConfigError(f"task {task_name}: batch must be 1 to {MAX_BATCH}, not {batch}")
    if debounce_ms < 0 or (debounce_ms and batch == 1):
        raise ConfigError(
            f"task {task_name}: debounce_ms needs a batch (batch=N, N > 1) and is >= 0"
        )
    if on_merge is not None and not callable(on_merge):
        raise ConfigError(f"task {task_name}: on_merge must be a function, not {on_merge!r}")
    if isinstance(key, str):
        fields = [f for _, f, _, _ in string.Formatter().parse(key) if f is not None]
        if not fields:
            raise ConfigError(f"task {task_name}: key {key!r} names no payload field")
    existing = _TASKS.get(task_name)
    if existing is not None and existing.fn is not fn and _origin(existing.fn) != _origin(fn):
        raise ConfigError(f"two tasks are named {task_name}: {_origin(existing.fn)}, {_origin(fn)}")
    spec = TaskSpec(task_name, fn, key, destination, batch, debounce_ms, on_merge)
    _TASKS[task_name] = spec
    return spec


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def registered(name: str) -> TaskSpec | None:
    """The task called ``name``, if one is registered in this process."""
    return _TASKS.get(name)


def all_tasks() -> list[TaskSpec]:
    """Every registered task."""
    return [_TASKS[n] for n in sorted(_TASKS)]


def import_app(modules: list[str]) -> None:
    """Import the user's modules (``-A`` / ``KEYLANE_APP``), which register their tasks;
    ``ConfigError`` names a module that cannot be imported and why.

    The working directory goes first on the import path, as ``celery -A`` does: a console
    script (``keylane``) has its own folder there instead, so ``keylane worker -A
    myapp.tasks`` run next to ``myapp/`` would not find it otherwise."""
    cwd = os.getcwd()
    if modules and cwd not in sys.path:
        sys.path.insert(0, cwd)
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            where = ""
            if isinstance(exc, ModuleNotFoundError):
                where = f" (looked in the working directory {cwd} and on the import path)"
            raise ConfigError(
                f"cannot import the app module {module!r}: {type(exc).__name__}: {exc}{where}"
            ) from exc
