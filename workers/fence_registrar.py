"""The registrar of a worker's newly acquired shards: the thread that registers each one's
fencing token with the store, so that from then on the store refuses any write of an
older owner.

The ownership's heartbeat (:mod:`keylane.workers.ownership`) talks to Redis only.
Registering a token is a store transaction, and a store can keep a transaction waiting
(SQLite's one write lock, a PostgreSQL row lock held by a paused owner, a slow disk): a
heartbeat stuck behind it would let this worker's own leases expire. So a newly acquired
shard is held (its lease renewed) but not yet offered to the lanes; this thread registers
its token, and only then may a lane take from it. If registration fails, the lease is
released for another worker or a later beat.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from ..routing.contract.errors import BrokerUnavailable, StoreUnavailable
from .broker import Lease, ShardLeases
from .store import FenceStore

log = logging.getLogger("keylane.ownership")


class AcquiredShards(Protocol):
    """What the registrar asks of the shards' owner
    (:class:`keylane.workers.ownership.Ownership`)."""

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still held (not released or lost since it was acquired)."""

    def registered(self, lease: Lease) -> None:
        """``lease``'s token is registered with the store: lanes may take from its shard."""

    def give_up(self, lease: Lease) -> None:
        """Drop a shard whose token could not be registered: nothing was taken from it."""


class FenceRegistrar:
    """Registers the token of each lease handed to :meth:`add`, in order, on its own thread."""

    def __init__(
        self,
        shards: AcquiredShards,
        broker: ShardLeases,
        store_factory: Callable[[], FenceStore],
    ) -> None:
        self._shards = shards
        self._broker = broker
        self._store_factory = store_factory
        self._unregistered: queue.SimpleQueue[Lease | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the registrar thread."""
        self.thread = threading.Thread(
            target=self._register_all, name="keylane-fences", daemon=True
        )
        self.thread.start()

    def add(self, lease: Lease) -> None:
        """A newly acquired lease, to be registered after those before it."""
        self._unregistered.put(lease)

    def stop(self) -> None:
        """Register nothing more; the thread ends (the caller joins :attr:`thread`)."""
        self._stop.set()
        self._unregistered.put(None)

    def _register_all(self) -> None:
        """Register the token of each newly acquired shard with the store, in order."""
        store: FenceStore | None = None
        while (lease := self._unregistered.get()) is not None:
            if self._stop.is_set():
                break  # stopping: every lease is released anyway
            if not self._shards.holds(lease):
                continue  # released or lost meanwhile
            try:
                store = store or self._store_factory()
                self._register(store, lease)
            except StoreUnavailable as exc:
                log.warning("cannot register fence of shard %s: %s", lease.shard, exc)
                self._shards.give_up(lease)
                if store is not None:
                    store.close()
                    store = None
            except Exception:
                log.exception("registering the fence of shard %s failed", lease.shard)
                self._shards.give_up(lease)
        if store is not None:
            store.close()

    def _register(self, store: FenceStore, lease: Lease) -> None:
        newest = store.advance_fence(lease.shard, lease.token)
        if newest > lease.token:
            # Redis lost its counter (restart without AOF): move it past the store's.
            log.warning(
                "shard %s: store fence %s is ahead of Redis %s; skipping ahead",
                lease.shard,
                newest,
                lease.token,
            )
            try:
                self._broker.bump_fence(lease.shard, newest)
            except BrokerUnavailable as exc:
                log.warning("Redis call failed: %s", exc)
            self._shards.give_up(lease)
            return
        self._shards.registered(lease)
