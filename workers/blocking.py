"""The lanes' threads for blocking calls: store transactions, Redis scripts, and the user's
synchronous code (a source handler, a plain ``def`` task, a version-checked destination).

The lanes themselves are coroutines on one event loop (:mod:`keylane.workers.lanes`): a
lane waiting for an ``async def`` task or an HTTP forward holds no thread at all. A lane
that must block hands the call to this pool and awaits it, so a few threads serve many
lanes; ``lane_threads`` bounds how many blocking calls run at once.

Each thread keeps its own store connection (a connection is never shared between threads),
opened on first use and reopened after the store was unavailable. The pool owns these
connections (a :class:`~keylane.workers.stores.sql.SqlStore` each, every role); a call
takes the roles it uses of its thread's connection. The threads are daemon threads: a
user's function that never returns cannot keep the process from exiting (the lane that
waits for it is given up by ownership's stuck-lane check).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..routing.contract.errors import StoreUnavailable
from .store import StoreConnection
from .stores.sql import SqlStore

log = logging.getLogger("keylane.lanes")

P = ParamSpec("P")
T = TypeVar("T")

#: (the caller's future, its loop, the caller's context, function, arguments, keyword
#: arguments, wants a store)
_Job = tuple[
    "asyncio.Future[Any]",
    asyncio.AbstractEventLoop,
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
    bool,
]


class BlockingPool:
    """``size`` daemon threads running the lanes' blocking calls (see the module docstring)."""

    def __init__(self, size: int, store_factory: Callable[[], SqlStore], name: str = "keylane-io"):
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

    async def store(
        self, fn: Callable[Concatenate[SqlStore, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(store, *args, **kwargs)`` in a pool thread, on that thread's store
        connection (``fn`` names the roles it uses: a function of two roles is handed the
        connection as both, ``lambda store: fn(store, store, ...)``)."""
        return await self._submit(fn, args, kwargs, wants_store=True)

    async def _submit(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], wants_store: bool
    ) -> T:
        # An asyncio future, answered from the thread through the loop: a lane makes two
        # or three of these calls per event, and a concurrent.futures.Future chained to an
        # asyncio one (a lock, a condition and two callbacks each) was a tenth of the
        # lanes' CPU.
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((future, loop, contextvars.copy_context(), fn, args, kwargs, wants_store))
        return await future

    def stop(self, timeout_s: float = 5.0) -> None:
        """Let the threads finish the calls queued so far, close their stores, and end."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _serve(self) -> None:
        store: SqlStore | None = None
        while True:
            job = self._jobs.get()
            if job is None:
                break
            future, loop, context, fn, args, kwargs, wants_store = job
            if future.cancelled():  # its lane gave up waiting (stopping)
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
                _answer(loop, future, _set_exception, exc)
            else:
                _answer(loop, future, _set_result, result)
        _close(store)


def _answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    answer: Callable[[asyncio.Future[Any], Any], None],
    value: Any,
) -> None:
    """Hand ``value`` to ``future`` on its loop (nobody waits any more once it closed)."""
    with contextlib.suppress(RuntimeError):  # the loop has closed
        loop.call_soon_threadsafe(answer, future, value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _close(store: StoreConnection | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception as exc:
            log.debug("closing store: %s", exc)
