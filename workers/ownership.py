"""Shard ownership of one worker process: membership, leases, fencing, handoff.

A background thread beats every ``heartbeat_ms``:

1. it records the worker as a live member and reads the live members;
2. it renews the leases it holds; a lease that could not be renewed is dropped at once,
   and lanes stop writing under it as soon as its local validity runs out, even when
   Redis cannot be reached to say so;
3. it computes the shards this worker should own (:func:`keylane.routing.assignment.assign_shards`)
   and releases the others gracefully: no new record is taken from a shard being
   released, the ones in flight are finished and acknowledged, then the lease is freed;
4. it acquires the shards it should own that are free. Each acquisition advances the
   shard's fencing token, and the token is registered with the store before the first
   message is taken, so from then on the store refuses any write of an older owner.

The heartbeat talks to Redis only. Registering a token is a store transaction, which may
wait long (:mod:`keylane.workers.fence_registrar`): a newly acquired shard is held but not
offered to the lanes until the registrar's thread has registered its token.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..routing.assignment import assign_shards
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.settings import Settings
from ..routing.shards import shard_ranges
from .broker import Acquired, Lease, ShardLeases
from .fence_registrar import FenceRegistrar
from .store import FenceStore
from .writer import StoreWriter

log = logging.getLogger("keylane.ownership")

#: Fraction of the lease TTL that a lane may use after the last successful renewal.
VALIDITY_FRACTION = 0.9

#: Exit status of a worker whose lanes are all stuck (EX_SOFTWARE).
EXIT_ALL_LANES_STUCK = 70


@dataclass
class HeldShard:
    """A shard this worker holds, as the lanes see it."""

    lease: Lease
    valid_until: float
    releasing: bool = False
    #: The lanes working on the shard now (many: one per record in flight), and since when.
    lanes: dict[int, float] = field(default_factory=dict)
    not_before: float = 0.0
    registered: bool = False  # its token is registered with the store: lanes may take

    @property
    def busy(self) -> bool:
        """Whether a lane works on the shard."""
        return bool(self.lanes)


def _takeable(held: HeldShard, now: float) -> bool:
    """Whether lanes may take from ``held`` now: registered with the store, not being handed
    off, within its validity, not backing off."""
    return (
        held.registered and not held.releasing and held.valid_until > now and held.not_before <= now
    )


class Ownership:
    """The shards one worker owns. Lanes ask it what they may take; a thread keeps it."""

    def __init__(
        self,
        settings: Settings,
        broker: ShardLeases,
        store_factory: Callable[[], FenceStore],
        worker_id: str,
        info: dict[str, object],
        clock: Callable[[], float] = time.monotonic,
        writer: StoreWriter | None = None,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.worker_id = worker_id
        self.info = info
        self._clock = clock
        self.writer = writer  # the SQLite store's writer claim, renewed by the heartbeat
        self._held: dict[int, HeldShard] = {}
        self._lock = threading.Condition()
        self._stopping = False
        self._rotation = 0
        self._thread: threading.Thread | None = None
        self._registrar = FenceRegistrar(self, broker, store_factory)
        self._stop = threading.Event()
        self._stuck: set[int] = set()  # lanes stuck on a shard that was given up
        self.ticks = 0
        #: Called with each newly acquired shard (the lanes look at it first).
        self.on_acquired: Callable[[int], None] | None = None

    # -- what lanes use ------------------------------------------------------------------

    def reserve(self, lane: int, preferred: Iterable[int], limit: int) -> list[Lease]:
        """Reserve up to ``limit`` shards for one take by ``lane``: those in ``preferred``
        first (shards the doorbell rang for), then others in rotation so that none starves.
        Many lanes may work on one shard (the broker hands each a different record); a
        reservation makes the shard wait for ``lane`` before it is handed off, and counts
        for the stuck-lane check. The caller ends every reservation it does not use
        (:meth:`end`)."""
        now = self._clock()
        with self._lock:
            if self._stopping:
                return []
            held = self._held
            order = [s for s in dict.fromkeys(preferred) if s in held and _takeable(held[s], now)]
            self._rotation += 1
            if len(order) < limit:  # the others in rotation (a busy worker's takes are rung)
                rest = sorted(s for s, h in held.items() if s not in order and _takeable(h, now))
                if rest:
                    start = self._rotation % len(rest)
                    order += rest[start:] + rest[:start]
            chosen = order[:limit]
            for shard in chosen:
                held[shard].lanes[lane] = now
            return [held[shard].lease for shard in chosen]

    def keep(self, lane: int, lease: Lease) -> bool:
        """Whether ``lane``, working on ``lease``'s shard, may take the shard's next record
        at once (as :meth:`reserve` would let it): the lease is still held, valid, not being
        handed off, and the process is not stopping. If so, its reservation is renewed (the
        stuck-lane check counts from now)."""
        now = self._clock()
        with self._lock:
            held = self._held.get(lease.shard)
            if self._stopping or held is None or held.lease != lease or not _takeable(held, now):
                return False
            held.lanes[lane] = now
            return True

    def owns(self, shard: int) -> bool:
        """Whether this worker holds ``shard`` now."""
        with self._lock:
            return shard in self._held

    def end(self, lane: int, shard: int) -> None:
        """``lane`` is done with ``shard`` (its record, or an unused reservation)."""
        with self._lock:
            self._stuck.discard(lane)
            held = self._held.get(shard)
            if held is not None:
                held.lanes.pop(lane, None)
            self._lock.notify_all()

    def back_off(self, shard: int, seconds: float) -> None:
        """Take nothing from ``shard`` for ``seconds`` (after an infrastructure error)."""
        with self._lock:
            held = self._held.get(shard)
            if held is not None:
                held.not_before = self._clock() + seconds

    def valid(self, lease: Lease) -> bool:
        """Whether ``lease`` is still held and within its local validity."""
        with self._lock:
            held = self._held.get(lease.shard)
            return held is not None and held.lease == lease and held.valid_until > self._clock()

    def lost(self, lease: Lease, why: str) -> None:
        """A lane learned that ``lease`` is gone (e.g. the store refused its fence)."""
        with self._lock:
            held = self._held.get(lease.shard)
            if held is None or held.lease != lease:
                return
            del self._held[lease.shard]
        log.warning("lost shard %s (token %s): %s", lease.shard, lease.token, why)
        self._try(lambda: self.broker.lose(lease, self.worker_id, why))

    def owned(self) -> dict[int, Lease]:
        """The leases held now, by shard."""
        with self._lock:
            return {s: h.lease for s, h in self._held.items()}

    # -- what the registrar uses ---------------------------------------------------------

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still held (not released or lost since it was acquired)."""
        with self._lock:
            held = self._held.get(lease.shard)
            return held is not None and held.lease == lease

    def registered(self, lease: Lease) -> None:
        """``lease``'s token is registered with the store: lanes may take from its shard."""
        with self._lock:
            held = self._held.get(lease.shard)
            if held is None or held.lease != lease:
                return
            held.registered = True
            self._lock.notify_all()
        if self.on_acquired is not None:
            self.on_acquired(lease.shard)

    def give_up(self, lease: Lease) -> None:
        """Drop a shard whose token could not be registered: nothing was taken from it."""
        with self._lock:
            held = self._held.get(lease.shard)
            if held is None or held.lease != lease:
                return
            del self._held[lease.shard]
        self._release_quietly(lease, "abandoned")

    # -- the heartbeat thread ------------------------------------------------------------

    def start(self) -> None:
        """Join the members and start the heartbeat and registrar threads (first beat
        before returning)."""
        self._registrar.start()
        self.tick()
        self._thread = threading.Thread(target=self._run, name="keylane-ownership", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_ms / 1000):
            try:
                self.tick()
            except Exception:
                log.exception("heartbeat failed")

    def tick(self) -> None:
        """One heartbeat: membership, renewals, releases, acquisitions (Redis only)."""
        try:
            self._tick()
        finally:
            self.ticks += 1

    def _tick(self) -> None:
        s = self.settings
        try:
            members = self.broker.heartbeat(self.worker_id, self.info, member_ttl_ms=s.lease_ttl_ms)
        except BrokerUnavailable as exc:
            log.warning("cannot reach Redis for heartbeat: %s", exc)
            return
        if self.writer is not None:
            self.writer.renew_or_exit()
        self._renew()
        self._abandon_stuck()
        wanted = (
            set()
            if self._stopping
            else set(assign_shards(s.shard_count, members).get(self.worker_id, []))
        )
        self._release_unwanted(wanted)
        acquired = [got for s in sorted(wanted - set(self.owned())) if (got := self._acquire(s))]
        if acquired:
            restored = sum(got.restored for got in acquired)
            log.info(
                "acquired %s shard(s): %s%s",
                len(acquired),
                shard_ranges([got.lease.shard for got in acquired if got.lease is not None]),
                f" ({restored} in-flight message(s) of a previous owner restored)"
                if restored
                else "",
            )

    def _renew(self) -> None:
        held = list(self.owned().values())
        sent_at = self._clock()
        try:
            renewed = self.broker.renew(held, self.settings.lease_ttl_ms)
        except BrokerUnavailable as exc:
            log.warning("cannot renew leases: %s", exc)
            return
        valid_until = sent_at + self.settings.lease_ttl_ms / 1000 * VALIDITY_FRACTION
        for lease, ok in zip(held, renewed, strict=True):
            if ok:
                with self._lock:
                    held_shard = self._held.get(lease.shard)
                    if held_shard is not None and held_shard.lease == lease:
                        held_shard.valid_until = valid_until
            else:
                self.lost(lease, "lease expired or taken before renewal")

    def _abandon_stuck(self) -> None:
        """A lane on one message past ``inflight_deadline_ms`` is stuck (a handler that
        hangs): give its shard up so another worker restores the message and goes on (its
        delivery count rises; past ``max_deliveries`` it becomes a poison dead letter).
        Python cannot stop the thread, but the store refuses its write once the next
        owner registered a newer fence. When every lane is stuck, the process exits so
        that its supervisor starts a fresh one."""
        deadline_s = self.settings.inflight_deadline_ms / 1000
        now = self._clock()
        with self._lock:
            stuck = []
            for held in list(self._held.values()):
                lanes = [n for n, since in held.lanes.items() if now - since > deadline_s]
                if lanes:
                    stuck.append(held.lease)
                    self._stuck.update(lanes)
                    del self._held[held.lease.shard]
            # A stuck lane may hold one of the blocking threads: when as many are stuck
            # as there are lanes or threads, nothing else can run.
            hopeless = len(self._stuck) >= min(self.settings.lanes, self.settings.lane_threads)
        for lease in stuck:
            log.critical(
                "lane stuck on shard %s for over %ss: giving the shard up", lease.shard, deadline_s
            )
            self._release_quietly(lease, "stuck")
        if hopeless:
            log.critical("every lane is stuck; exiting so the supervisor restarts this worker")
            logging.shutdown()
            os._exit(EXIT_ALL_LANES_STUCK)

    def _release_unwanted(self, wanted: set[int]) -> None:
        with self._lock:
            for shard, held in self._held.items():
                if shard not in wanted:
                    held.releasing = True
            ready = [h.lease for h in self._held.values() if h.releasing and not h.busy]
        released = []
        for lease in ready:
            try:
                self.broker.release_lease(lease, self.worker_id)
            except BrokerUnavailable as exc:
                log.warning("cannot release shard %s: %s", lease.shard, exc)
                continue
            with self._lock:
                self._held.pop(lease.shard, None)
            log.debug("released shard %s (token %s)", lease.shard, lease.token)
            released.append(lease.shard)
        if released:
            log.info("released %s shard(s): %s", len(released), shard_ranges(released))

    def _acquire(self, shard: int) -> Acquired | None:
        """Take ``shard``'s lease if it is free (one line per shard at DEBUG; the
        heartbeat logs one line for all it took)."""
        sent_at = self._clock()
        try:
            got = self.broker.acquire(shard, self.worker_id, self.settings.lease_ttl_ms)
        except BrokerUnavailable as exc:
            log.warning("cannot acquire shard %s: %s", shard, exc)
            return None
        if got.lease is None:
            return None
        valid_until = sent_at + self.settings.lease_ttl_ms / 1000 * VALIDITY_FRACTION
        with self._lock:
            self._held[shard] = HeldShard(got.lease, valid_until)
        self._registrar.add(got.lease)
        log.debug("acquired shard %s (token %s, restored %s)", shard, got.lease.token, got.restored)
        return got

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking messages, wait for lanes to finish, release every lease, leave."""
        deadline = self._clock() + timeout_s
        with self._lock:
            self._stopping = True
            while any(h.busy for h in self._held.values()) and self._clock() < deadline:
                self._lock.wait(0.05)
        self._stop.set()
        self._registrar.stop()
        for thread in (self._thread, self._registrar.thread):
            if thread is not None:
                thread.join(timeout=max(0.0, deadline - self._clock()) + 1)
        for lease in list(self.owned().values()):
            self._release_quietly(lease, "released")
        with self._lock:
            self._held.clear()
        if self.writer is not None:
            self._try(self.writer.release)
        self._try(lambda: self.broker.leave(self.worker_id))

    def _release_quietly(self, lease: Lease, reason: str) -> None:
        """Release ``lease``; a Redis outage is logged (the lease then simply expires)."""
        self._try(lambda: self.broker.release_lease(lease, self.worker_id, reason))

    @staticmethod
    def _try(fn: Callable[[], object]) -> None:
        try:
            fn()
        except BrokerUnavailable as exc:
            log.warning("Redis call failed: %s", exc)
