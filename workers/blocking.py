"""The lanes' threads for blocking calls: store transactions, Redis scripts, and the user's
synchronous code (a source handler, a plain ``def`` task, a version-checked destination).

The lanes themselves are coroutines on one event loop (:mod:`keylane.workers.lanes`): a
lane waiting for an ``async def`` task or an HTTP forward holds no thread at all. A lane
that must block hands the call to this pool and awaits it, so a few threads serve many
lanes; ``lane_threads`` bounds how many blocking calls run at once.

Each thread keeps its own store connection (a connection is never shared between threads),
opened on first use and reopened after the store was unavailable. The threads are daemon
threads: a user's function that never returns cannot keep the process from exiting (the
lane that waits for it is given up by ownership's stuck-lane check).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

from ..routing.contract.errors import StoreUnavailable
from .store import Store

log = logging.getLogger("keylane.lanes")

P = ParamSpec("P")
T = TypeVar("T")

#: (future, the caller's context, function, arguments, keyword arguments, wants a store)
_Job = tuple[
    Future[Any], contextvars.Context, Callable[..., Any], tuple[Any, ...], dict[str, Any], bool
]


class BlockingPool:
    """``size`` daemon threads running the lanes' blocking calls (see the module docstring)."""

    def __init__(self, size: int, store_factory: Callable[[], Store], name: str = "keylane-io"):
        self.size = size
        self._store_factory = store_factory
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads."""
        for n in range(self.size):
            thread = threading.Thread(target=self._serve, name=f"{self._name}-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a pool thread, with the caller's context variables
        (the event's log context, its Sentry scope)."""
        return await self._submit(fn, args, kwargs, wants_store=False)

    async def store(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(store, *args, **kwargs)`` in a pool thread, on that thread's store
        connection."""
        return await self._submit(fn, args, kwargs, wants_store=True)

    async def _submit(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], wants_store: bool
    ) -> T:
        future: Future[T] = Future()
        self._jobs.put((future, contextvars.copy_context(), fn, args, kwargs, wants_store))
        return await asyncio.wrap_future(future)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Let the threads finish the calls queued so far, close their stores, and end."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _serve(self) -> None:
        store: Store | None = None
        while True:
            job = self._jobs.get()
            if job is None:
                break
            future, context, fn, args, kwargs, wants_store = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if wants_store:
                    store = store or self._store_factory()
                    result = context.run(fn, store, *args, **kwargs)
                else:
                    result = context.run(fn, *args, **kwargs)
            except BaseException as exc:
                if isinstance(exc, StoreUnavailable):
                    _close(store)
                    store = None
                future.set_exception(exc)
            else:
                future.set_result(result)
        _close(store)


def _close(store: Store | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception as exc:
            log.debug("closing store: %s", exc)
