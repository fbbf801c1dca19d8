"""The lanes' broker on RabbitMQ: quorum queues with a single active consumer, one per
shard; the worker side's one module that imports the AMQP client (kombu / py-amqp).

What RabbitMQ gives, and what keylane adds (facts checked in ``ops/docs/rabbitmq.md``):

* **Ownership** is the broker's single active consumer (SAC): every shard queue has at
  most one consumer receiving, and when it dies (its process, its node, its connection
  after missed AMQP heartbeats) its unacknowledged deliveries go to the next consumer
  first, in their original order. A consumer learns that it is the active one when its
  first delivery arrives; only then does it hold a :class:`Lease`.
* **Fencing**: RabbitMQ has no token a consumer could show the store, so the store keeps
  one: at the first delivery of each consumer registration the worker claims the shard's
  next token (:meth:`Store.claim_fence`, the same ``shard_fences`` row the Redis leases
  advance), then checks with one round trip on the same channel that its connection is
  still the one that received (a paused worker whose connection the broker dropped fails
  here). Every write transaction checks the token: a paused or partitioned consumer's
  late write is refused once the next consumer claimed its token.
* **Per-record order with many records in flight**: one channel per shard, ``prefetch``
  deliveries held in memory, grouped by record in delivery order; a record has at most one
  message (or one batch) with a lane, and the others wait behind it. Acknowledgements go
  one message at a time, in any order.
* **No delivery held past the consumer timeout** (the broker would close the channel and
  redeliver): a record that would keep its deliveries longer than half
  ``amqp_hold_budget_s`` (a long wait, or a backlog) is **parked**: its messages are
  written to the store (``Store.park``, fenced), then acknowledged; its later deliveries
  are parked behind them; lanes take parked messages from the store when due and delete
  each once done (``Store.unpark``). A new consumer reads its shards' parked records
  before it hands anything out.
* **Graceful handoff** closes the shard's channel (never ``basic.cancel``, after which the
  next consumer would run later messages while this one still holds earlier ones): what
  it held returns to the head of the queue, in order.
* **Delivery limit**: ``x-delivery-limit`` is ``max_deliveries + amqp_delivery_margin``;
  the lanes see ``x-delivery-count`` and dead-letter a message past ``max_deliveries``
  themselves; a message that goes past the broker's limit anyway (a worker killed every
  time it was handed out) is dead-lettered at least once to the ``<ns>.dead`` queue,
  which this broker consumes and hands to ``on_dead`` (a ``poison`` dead letter in the
  store): never dropped.
* **Even spread**: a worker consumes only the shards the rendezvous assignment over the
  live members gives it (membership: a fanout exchange of AMQP heartbeats), and hands a
  shard back (closes its channel) when the assignment moves it. The broker's own choice
  would be whoever registered first: one worker with every shard.

All AMQP traffic runs in one thread (``keylane-amqp``) per process: py-amqp connections
are not thread-safe. Lanes and ownership call from their threads; the calls that need the
broker (acks, consuming, closing a channel) are queued to that thread.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import random
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from amqp import Message  # type: ignore[import-untyped]
from amqp.exceptions import (  # type: ignore[import-untyped]
    ConnectionError as AmqpConnectionError,
)
from amqp.exceptions import RecoverableConnectionError
from kombu.connection import Connection as _KombuConnection

from ...routing.assignment import assign_shards
from ...routing.contract.amqp_names import (
    dead_queue,
    members_exchange,
    shard_queue,
    topology,
)
from ...routing.contract.errors import BrokerUnavailable, StaleFence, StoreUnavailable
from ...routing.contract.message import BATCH_HEADER, RECORD_HEADER
from ...routing.contract.settings import Settings
from ..broker import Ack, Acquired, Counts, Idle, LaneBroker, Lease, Taken
from ..store import Fence, Store

log = logging.getLogger("keylane.rabbitmq")

#: kombu's connection is untyped: used as ``Any``.
Connection: Any = _KombuConnection

#: How long the AMQP thread waits for a frame before it looks at its queued calls.
DRAIN_S = 0.05
#: How long a caller waits for the AMQP thread to run a call it needs the answer of.
CALL_TIMEOUT_S = 15.0
#: Pause between two connection attempts (each goes to the next node).
RECONNECT_S = 0.5


def declare_topology(channel: Any, settings: Settings) -> None:
    """Declare the deployment's exchanges and queues (idempotent)."""
    wanted = topology(settings)
    for exchange, kind in wanted.exchanges:
        channel.exchange_declare(exchange, kind, durable=True, auto_delete=False)
    for name, arguments in wanted.queues:
        channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
    for name, exchange in wanted.bindings:
        channel.queue_bind(name, exchange, name)


def delete_topology(settings: Settings) -> None:
    """Delete the deployment's queues and exchanges (benchmarks and tools clean up)."""
    conn, _ = connect(settings.amqp_urls(), settings.amqp_heartbeat_s)
    try:
        channel = conn.channel()
        wanted = topology(settings)
        for name, _arguments in wanted.queues:
            channel.queue_delete(name)
        for exchange, _kind in wanted.exchanges:
            channel.exchange_delete(exchange)
        channel.exchange_delete(members_exchange(settings.namespace))
    finally:
        conn.release()


def connect(urls: Sequence[str], heartbeat_s: int, start: int = 0) -> tuple[Any, int]:
    """A connection to the first node of ``urls`` (from index ``start``) that answers;
    :class:`BrokerUnavailable` when none does."""
    errors = []
    for step in range(len(urls)):
        index = (start + step) % len(urls)
        conn = Connection(urls[index], heartbeat=heartbeat_s, connect_timeout=5)
        try:
            conn.connect()
            return conn, index
        except Exception as exc:
            errors.append(f"{_host(urls[index])}: {exc}")
            with contextlib.suppress(Exception):
                conn.release()
    raise BrokerUnavailable(f"RabbitMQ: no node answers ({'; '.join(errors)})")


def _host(url: str) -> str:
    return url.rpartition("@")[2].partition("/")[0]


def message_headers(raw: bytes) -> dict[str, Any]:
    """The Celery headers in a keylane message (the Redis envelope it travels in)."""
    try:
        headers = json.loads(raw).get("headers") or {}
    except (ValueError, AttributeError):
        return {}
    return headers if isinstance(headers, dict) else {}


@dataclass
class Delivery:
    """A message the shard's channel delivered and this worker has not acknowledged."""

    tag: int
    raw: bytes
    record_key: str
    batch: str
    #: Times the broker handed it out before (``x-delivery-count``).
    returned: int
    #: Times a lane of this worker took it.
    taken: int = 0
    received: float = field(default_factory=time.monotonic)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardConsumer:
    """This worker's consumer of one shard queue, and what it holds."""

    shard: int
    channel: Any
    tag: str
    #: The store token claimed for this registration (0: not active yet / not claimed).
    epoch: int = 0
    active: bool = False
    alive: bool = True
    deliveries: dict[int, Delivery] = field(default_factory=dict)
    #: Record key -> its deliveries' tags, in delivery order; records in order of arrival.
    records: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)
    #: Records with a lane: the tags handed out, and since when.
    busy: dict[str, tuple[list[int], float]] = field(default_factory=dict)
    #: Records waiting until a time (monotonic).
    due: dict[str, float] = field(default_factory=dict)
    #: Records with messages parked in the store, and when they are due (epoch seconds):
    #: their deliveries here wait behind those (they are parked too, then acknowledged).
    parked: dict[str, float] = field(default_factory=dict)

    def lease_value(self, worker_id: str) -> str:
        return f"{worker_id}/{self.tag}"


class _Subscription:
    """The doorbell as :class:`LaneBroker` hands it out: shards that just got messages."""

    def __init__(self, owner: RabbitLaneBroker) -> None:
        self._owner = owner
        self.queue: queue.SimpleQueue[int] = queue.SimpleQueue()

    def get_message(self, timeout: float = 0.0) -> dict[str, Any] | None:
        try:
            return {"data": self.queue.get(timeout=timeout)}
        except queue.Empty:
            return None

    def close(self) -> None:
        self._owner._subscriptions.discard(self)


class RabbitLaneBroker(LaneBroker):
    """:class:`LaneBroker` on a RabbitMQ cluster (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store_factory: Callable[[], Store],
        on_dead: Callable[[bytes, dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.urls = settings.amqp_urls()
        self._store_factory = store_factory
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._on_dead = on_dead
        self._lock = threading.RLock()
        self._shards: dict[int, ShardConsumer] = {}
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any] | None]] = (
            queue.SimpleQueue()
        )
        self._subscriptions: set[_Subscription] = set()
        self._members: dict[str, float] = {}
        self._member_ttl_s = settings.lease_ttl_ms / 1000
        self.worker_id = ""
        self._info: dict[str, Any] = {}
        self._connection: Any = None
        # Workers start on different nodes, so one node's loss is not every worker's.
        self._node = random.randrange(len(self.urls))
        self._generation = 0
        self._control: Any = None
        self._dead_channel: Any = None
        self._stop = threading.Event()
        self._dead_work: queue.SimpleQueue[tuple[int, int, bytes, dict[str, Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="keylane-amqp", daemon=True)
        self._dead_thread = threading.Thread(
            target=self._dead_letters, name="keylane-amqp-dead", daemon=True
        )
        self._thread.start()
        self._dead_thread.start()

    # -- the AMQP thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning("RabbitMQ connection lost: %s", exc)
            self._drop_connection()
            self._stop.wait(RECONNECT_S)
        self._drop_connection()

    def _serve(self) -> None:
        conn, self._node = connect(self.urls, self.settings.amqp_heartbeat_s, self._node + 1)
        with self._lock:
            self._connection = conn
            self._generation += 1
        self._control = conn.channel()
        declare_topology(self._control, self.settings)
        self._join_members()
        if self._on_dead is not None:
            self._consume_dead(conn)
        log.info("connected to RabbitMQ at %s", _host(self.urls[self._node]))
        beat_every = self.settings.heartbeat_ms / 1000
        next_beat = 0.0
        while not self._stop.is_set():
            self._run_calls()
            now = time.monotonic()
            if self.worker_id and now >= next_beat:
                self._beat("alive")
                next_beat = now + beat_every
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=DRAIN_S)
            conn.heartbeat_check()
        # Stopping: close properly, so the acknowledgements just sent are read before the
        # broker sees the connection end (what is still unacknowledged goes back in order).
        with contextlib.suppress(Exception):
            conn.release()

    def _run_calls(self) -> None:
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn()
            except Exception as exc:
                if done is not None:
                    done.set_exception(exc)
                if _is_connection_error(exc):
                    raise
                log.warning("AMQP call failed: %s", exc)
                continue
            if done is not None:
                done.set_result(result)

    def _drop_connection(self) -> None:
        """The connection is gone: the broker gives back everything it delivered on it,
        so every shard consumer and what it held is forgotten."""
        with self._lock:
            conn, self._connection = self._connection, None
            for consumer in self._shards.values():
                consumer.alive = False
            self._shards.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.collect()
        self._control = None
        self._dead_channel = None

    def _submit(self, fn: Callable[[], Any], wait: bool = False) -> Any:
        """Run ``fn`` in the AMQP thread; with ``wait``, return its result."""
        if not wait:
            self._calls.put((fn, None))
            return None
        done: Future[Any] = Future()
        self._calls.put((fn, done))
        try:
            return done.result(CALL_TIMEOUT_S)
        except Exception as exc:
            raise BrokerUnavailable(f"RabbitMQ: {exc}") from exc

    # -- membership -----------------------------------------------------------------------

    def _join_members(self) -> None:
        channel = self._control
        exchange = members_exchange(self.settings.namespace)
        channel.exchange_declare(exchange, "fanout", durable=False, auto_delete=False)
        inbox = f"{exchange}:{uuid.uuid4().hex[:12]}"
        channel.queue_declare(inbox, exclusive=True, auto_delete=True)
        channel.queue_bind(inbox, exchange, "")
        channel.basic_consume(inbox, no_ack=True, callback=self._on_beat)

    def _beat(self, what: str) -> None:
        body = json.dumps({"worker": self.worker_id, "what": what, "info": self._info})
        exchange = members_exchange(self.settings.namespace)
        self._control.basic_publish(Message(body), exchange=exchange)

    def _on_beat(self, message: Any) -> None:
        try:
            beat = json.loads(_body(message))
            worker, what = str(beat["worker"]), beat["what"]
        except (ValueError, KeyError, TypeError):
            return
        with self._lock:
            if what == "left":
                self._members.pop(worker, None)
            else:
                self._members[worker] = time.monotonic()

    def heartbeat(self, worker_id: str, info: dict[str, Any], member_ttl_ms: int) -> list[str]:
        self.worker_id, self._info, self._member_ttl_s = worker_id, info, member_ttl_ms / 1000
        now = time.monotonic()
        with self._lock:
            connected = self._connection is not None
            self._members[worker_id] = now if connected else self._members.get(worker_id, 0.0)
            for member, seen in list(self._members.items()):
                if now - seen > self._member_ttl_s:
                    del self._members[member]
            members = sorted(self._members)
        if not connected:
            raise BrokerUnavailable("RabbitMQ: not connected")
        mine = assign_shards(self.settings.shard_count, members).get(worker_id, [])
        self.release_unleased(set(mine))
        self.park_stale()
        return members

    def leave(self, worker_id: str) -> None:
        with contextlib.suppress(BrokerUnavailable):
            self._submit(lambda: self._beat("left"), wait=True)

    # -- ownership --------------------------------------------------------------------

    def acquire(self, shard: int, worker_id: str, ttl_ms: int) -> Acquired:
        """Consume the shard (a new consumer is last in line); once this consumer is the
        active one (its first delivery came), claim the store's next token for it and
        hand out the lease."""
        self.worker_id = worker_id
        with self._lock:
            consumer = self._shards.get(shard)
            connected = self._connection is not None
        if consumer is None:
            if connected:
                self._submit(lambda: self._consume(shard), wait=True)
            return Acquired(None, "", 0)
        if not consumer.active or not consumer.alive:
            return Acquired(None, "", 0)
        if consumer.epoch == 0:
            epoch = self._stored(lambda store: store.claim_fence(shard))
            # One round trip on the channel that received: if the broker dropped this
            # connection (and another consumer took over), this fails and no lane writes
            # under the token just claimed.
            prefetch = self.settings.amqp_prefetch
            self._submit(lambda: _round_trip(consumer, prefetch), wait=True)
            # Records parked by earlier consumers: their deliveries wait behind them.
            parked = {row.record_key: row.due_at for row in self._stored(lambda s: s.parked(shard))}
            with self._lock:
                if self._shards.get(shard) is not consumer or not consumer.alive:
                    return Acquired(None, "", 0)
                consumer.epoch = epoch
                consumer.parked = parked
        value = consumer.lease_value(worker_id)
        held = sum(1 for d in consumer.deliveries.values() if d.returned)
        return Acquired(Lease(shard, value, consumer.epoch), value, held)

    def _consume(self, shard: int) -> None:
        """(AMQP thread.) Register a consumer of the shard on a channel of its own."""
        with self._lock:
            if shard in self._shards or self._connection is None:
                return
            channel = self._connection.channel()
        channel.basic_qos(0, self.settings.amqp_prefetch, False)
        tag = f"{self.worker_id}/{shard}/{uuid.uuid4().hex[:8]}"
        consumer = ShardConsumer(shard, channel, tag)
        with self._lock:
            self._shards[shard] = consumer
        name = shard_queue(self.settings.namespace, self.settings.shards, shard)

        def delivered(message: Any) -> None:
            self._delivered(consumer, message)

        channel.basic_consume(name, consumer_tag=tag, callback=delivered)

    def _delivered(self, consumer: ShardConsumer, message: Any) -> None:
        """(AMQP thread.) A delivery: into its record's list, in order."""
        raw = _body(message)
        headers = message.headers or {}
        embedded = message_headers(raw)
        record_key = str(headers.get(RECORD_HEADER) or embedded.get(RECORD_HEADER) or "")
        batch = str(embedded.get(BATCH_HEADER) or "")
        tag = int(message.delivery_tag)
        returned = int(headers.get("x-delivery-count") or 0)
        with self._lock:
            if not consumer.alive:
                return
            consumer.active = True
            consumer.deliveries[tag] = Delivery(tag, raw, record_key, batch, returned)
            consumer.records.setdefault(record_key, []).append(tag)
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.queue.put(consumer.shard)

    def renew(self, leases: Sequence[Lease], ttl_ms: int) -> list[bool]:
        with self._lock:
            return [self._current(lease) is not None for lease in leases]

    def _current(self, lease: Lease) -> ShardConsumer | None:
        consumer = self._shards.get(lease.shard)
        if (
            consumer is None
            or not consumer.alive
            or consumer.epoch != lease.token
            or consumer.lease_value(self.worker_id) != lease.value
        ):
            return None
        return consumer

    def release_lease(self, lease: Lease, worker_id: str, reason: str = "released") -> bool:
        """Hand the shard over: close its channel (after the acks queued before), so what
        this worker held goes back to the head of the queue in order."""
        with self._lock:
            consumer = self._shards.get(lease.shard)
            if consumer is None or consumer.lease_value(worker_id) != lease.value:
                return False
            del self._shards[lease.shard]
            consumer.alive = False
        self._submit(lambda: _close(consumer.channel))
        log.debug("handed shard %s over (%s)", lease.shard, reason)
        return True

    def release_unleased(self, keep: set[int]) -> None:
        """Stop consuming the shards not in ``keep`` that never became a lease (a
        consumer registered for a shard the assignment has since moved away)."""
        with self._lock:
            idle = [c for s, c in self._shards.items() if s not in keep and c.epoch == 0]
            for consumer in idle:
                del self._shards[consumer.shard]
                consumer.alive = False
        for consumer in idle:
            self._submit(functools.partial(_close, consumer.channel))

    def log_lease_event(self, event: str, lease: Lease, worker_id: str) -> None:
        log.info("shard %s (token %s): %s", lease.shard, lease.token, event)

    def bump_fence(self, shard: int, at_least: int) -> int:
        # Tokens come from the store itself: there is no second counter to move.
        return at_least

    # -- records ----------------------------------------------------------------------

    def take(self, leases: Sequence[Lease]) -> Taken | Idle:
        now = time.monotonic()
        due_in: dict[int, float] = {}
        for lease in leases:
            with self._lock:
                consumer = self._current(lease)
                behind = self._behind_parked(consumer) if consumer is not None else []
            if consumer is None:
                continue
            for key, deliveries in behind:
                self._park(consumer, lease, key, deliveries, consumer.parked.get(key, 0.0))
            with self._lock:
                if self._current(lease) is not consumer:
                    continue
                taken = self._take_from(consumer, now, parked_ok=True)
                if taken is None:
                    waits = [at - now for k, at in consumer.due.items() if k not in consumer.busy]
                    waits += [
                        at - time.time()
                        for k, at in consumer.parked.items()
                        if k not in consumer.busy
                    ]
                    if waits:
                        due_in[lease.shard] = max(0.0, min(waits))
                    continue
            if isinstance(taken, Taken):
                return taken
            unparked = self._take_parked(consumer, lease, taken)
            if unparked is not None:
                return unparked
        return Idle(due_in)

    def _take_from(
        self, consumer: ShardConsumer, now: float, parked_ok: bool = False
    ) -> Taken | str | None:
        """(Under the lock.) The next due record: handed out from memory, or (with
        ``parked_ok``) the key of a due parked record, marked busy for the caller to read
        from the store."""
        if parked_ok:
            wall = time.time()
            for key, due_at in consumer.parked.items():
                if key not in consumer.busy and due_at <= wall:
                    consumer.busy[key] = ([], now)
                    return key
        for key, tags in consumer.records.items():
            if key in consumer.busy or key in consumer.parked or not tags:
                continue
            if consumer.due.get(key, 0.0) > now:
                continue
            consumer.due.pop(key, None)
            first = consumer.deliveries[tags[0]]
            handed = [first]
            limit = _batch_limit(first.batch)
            for tag in tags[1:limit]:
                follower = consumer.deliveries[tag]
                if follower.batch != first.batch or follower.returned or follower.taken:
                    break
                handed.append(follower)
            for delivery in handed:
                delivery.taken += 1
            consumer.busy[key] = ([d.tag for d in handed], now)
            return Taken(
                consumer.shard,
                key,
                first.raw,
                first.returned + first.taken,
                False,
                tuple(d.raw for d in handed[1:]),
            )
        return None

    # -- parking: records that wait longer than the broker may hold a delivery --------

    def _behind_parked(self, consumer: ShardConsumer) -> list[tuple[str, list[Delivery]]]:
        """(Under the lock.) Deliveries of parked records that are not parked yet, each
        record marked busy while they are."""
        found = []
        for key in consumer.parked:
            tags = consumer.records.get(key)
            if tags and key not in consumer.busy:
                consumer.busy[key] = ([], time.monotonic())
                found.append((key, [consumer.deliveries[t] for t in tags]))
        return found

    def _stale(self, consumer: ShardConsumer) -> list[tuple[str, list[Delivery]]]:
        """(Under the lock.) Records not in a lane whose first delivery is held longer
        than half the hold budget (a backlog): marked busy, to be parked due now."""
        limit = time.monotonic() - self.settings.amqp_hold_budget_s / 2
        found = []
        for key, tags in consumer.records.items():
            if tags and key not in consumer.busy and consumer.deliveries[tags[0]].received < limit:
                consumer.busy[key] = ([], time.monotonic())
                found.append((key, [consumer.deliveries[t] for t in tags]))
        return found

    def park_stale(self) -> int:
        """Park every record whose deliveries are held too long (the heartbeat calls it):
        how many records were parked."""
        parked = 0
        with self._lock:
            work = [(c, self._stale(c)) for c in self._shards.values() if c.epoch and c.alive]
        for consumer, records in work:
            lease = Lease(consumer.shard, consumer.lease_value(self.worker_id), consumer.epoch)
            for key, deliveries in records:
                parked += self._park(consumer, lease, key, deliveries, time.time())
        return parked

    def _park(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        deliveries: list[Delivery],
        due_at: float,
    ) -> bool:
        """Write ``deliveries`` (the record's, in order, marked busy by the caller) to the
        store behind what is parked, under the shard's fence, then acknowledge them. On
        failure they stay here, and the record waits in memory."""
        messages = [(d.raw, d.returned + d.taken) for d in deliveries]
        fence = Fence(lease.shard, lease.token)
        try:
            self._stored(lambda store: store.park(lease.shard, key, messages, due_at, fence))
        except Exception as exc:
            log.warning("shard %s: could not park %s: %s", lease.shard, key, exc)
            with self._lock:
                consumer.busy.pop(key, None)
            return False
        with self._lock:
            tags = consumer.records.get(key, [])
            for delivery in deliveries:
                consumer.deliveries.pop(delivery.tag, None)
                if delivery.tag in tags:
                    tags.remove(delivery.tag)
            if not tags:
                consumer.records.pop(key, None)
            consumer.due.pop(key, None)
            consumer.parked[key] = due_at
            consumer.busy.pop(key, None)
            alive, channel = consumer.alive, consumer.channel
        if alive:  # else the broker gives them back: parked again behind, the journal dedupes
            self._submit(functools.partial(_ack, channel, [d.tag for d in deliveries]))
        log.info("shard %s: parked %s message(s) of %s", lease.shard, len(messages), key)
        return True

    def _take_parked(self, consumer: ShardConsumer, lease: Lease, key: str) -> Taken | None:
        """Hand out the first parked message of ``key`` (marked busy by the caller),
        its delivery counted in the store."""
        try:
            rows = self._stored(lambda store: store.parked(lease.shard, key, limit=1))
            if rows:
                first = rows[0]
                self._stored(lambda s: s.count_parked(lease.shard, key, first.seq))
        except Exception:
            with self._lock:
                consumer.busy.pop(key, None)
            raise
        with self._lock:
            if not rows:
                consumer.parked.pop(key, None)
                consumer.busy.pop(key, None)
                return None
            consumer.busy[key] = ([-first.seq], time.monotonic())
        return Taken(lease.shard, key, first.raw, first.deliveries + 1)

    def _stored(self, fn: Callable[[Store], Any]) -> Any:
        """Run ``fn`` on this broker's store connection (one at a time)."""
        with self._store_lock:
            try:
                self._store = self._store or self._store_factory()
                return fn(self._store)
            except StoreUnavailable:
                if self._store is not None:
                    self._store.close()
                self._store = None
                raise

    def finish(
        self,
        lease: Lease,
        taken: Taken,
        acks: Sequence[Ack],
        hold: int | None = None,
        then_take: bool = False,
    ) -> Taken | bool:
        if hold is not None:
            # Sources whose policy is hold are refused on RabbitMQ at start-up (their
            # record would wait with deliveries unacknowledged, past the consumer timeout).
            log.error("shard %s: hold %s ignored on RabbitMQ", lease.shard, hold)
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return False
            handed, _ = consumer.busy.get(taken.record_key, ([], 0.0))
        if handed and handed[0] < 0:
            return self._finish_parked(consumer, lease, taken, [-t for t in handed], acks)
        with self._lock:
            if self._current(lease) is not consumer:
                return False
            consumer.busy.pop(taken.record_key, None)
            acked = {ack.raw for ack in acks}
            tags = consumer.records.get(taken.record_key, [])
            done = [
                t
                for t in handed
                if t in consumer.deliveries and consumer.deliveries[t].raw in acked
            ]
            for tag in done:
                del consumer.deliveries[tag]
                tags.remove(tag)
            if not tags:
                consumer.records.pop(taken.record_key, None)
            channel = consumer.channel
            nxt = self._take_from(consumer, time.monotonic()) if then_take else None
        if done:
            self._submit(functools.partial(_ack, channel, done))
        return nxt if isinstance(nxt, Taken) else True

    def _finish_parked(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        taken: Taken,
        seqs: list[int],
        acks: Sequence[Ack],
    ) -> bool:
        """A parked message done with: forget it in the store (fenced)."""
        key = taken.record_key
        remaining = 1
        if acks:
            fence = Fence(lease.shard, lease.token)
            try:
                remaining = self._stored(lambda s: s.unpark(lease.shard, key, seqs, fence))
            except StaleFence:
                return False
            finally:
                with self._lock:
                    consumer.busy.pop(key, None)
        with self._lock:
            consumer.busy.pop(key, None)
            if remaining == 0:
                consumer.parked.pop(key, None)
        return True

    def wait(
        self,
        lease: Lease,
        taken: Taken,
        delay_s: float,
        why: dict[str, Any],
        counts: Counts = "keep",
        messages: Sequence[bytes] = (),
    ) -> bool:
        key = taken.record_key
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return False
            handed, _ = consumer.busy.get(key, ([], 0.0))
        if handed and handed[0] < 0:
            return self._wait_parked(consumer, lease, key, -handed[0], delay_s, counts)
        with self._lock:
            if self._current(lease) is not consumer:
                return False
            consumer.busy.pop(key, None)
            uncount = set(messages) if counts != "keep" else set()
            for tag in handed:
                delivery = consumer.deliveries.get(tag)
                if delivery is not None and delivery.raw in uncount:
                    delivery.taken = max(0, delivery.taken - 1)
            if counts == "forget":
                for tag in handed[1:]:
                    if tag in consumer.deliveries:
                        consumer.deliveries[tag].taken = 0
            tags = consumer.records.get(key, [])
            oldest = consumer.deliveries[tags[0]].received if tags else time.monotonic()
            held_s = time.monotonic() - oldest + delay_s
            if held_s <= self.settings.amqp_hold_budget_s / 2:
                consumer.due[key] = time.monotonic() + max(0.0, delay_s)
                return True
            # Too long to hold the deliveries: park them in the store.
            consumer.busy[key] = ([], time.monotonic())
            deliveries = [consumer.deliveries[t] for t in tags]
        if not self._park(consumer, lease, key, deliveries, time.time() + delay_s):
            with self._lock:
                consumer.due[key] = time.monotonic() + max(0.0, delay_s)
        return True

    def _wait_parked(
        self,
        consumer: ShardConsumer,
        lease: Lease,
        key: str,
        seq: int,
        delay_s: float,
        counts: Counts,
    ) -> bool:
        """A parked message's record waits again: its new due time in the store."""
        due_at = time.time() + delay_s
        fence = Fence(lease.shard, lease.token)
        try:
            if counts != "keep":
                self._stored(lambda s: s.count_parked(lease.shard, key, seq, -1))
            self._stored(lambda s: s.park(lease.shard, key, [], due_at, fence))
        except StaleFence:
            return False
        finally:
            with self._lock:
                consumer.busy.pop(key, None)
        with self._lock:
            consumer.parked[key] = due_at
        return True

    def in_flight(self, shard: int) -> list[str]:
        with self._lock:
            consumer = self._shards.get(shard)
            return list(consumer.busy) if consumer is not None else []

    def reclaim(self, lease: Lease, record_keys: Sequence[str], min_age_s: float) -> int:
        now = time.monotonic()
        with self._lock:
            consumer = self._current(lease)
            if consumer is None:
                return -1
            found = 0
            for key in record_keys:
                busy = consumer.busy.get(key)
                if busy is not None and now - busy[1] >= min_age_s:
                    del consumer.busy[key]
                    found += 1
            return found

    # -- notes kept with an in-flight message (in memory: they go with the delivery) ----

    def _delivery(self, shard: int, raw: bytes) -> Delivery | None:
        consumer = self._shards.get(shard)
        if consumer is None:
            return None
        return next((d for d in consumer.deliveries.values() if d.raw == raw), None)

    def _note(self, shard: int, raw: bytes, what: str, value: Any) -> None:
        with self._lock:
            delivery = self._delivery(shard, raw)
            if delivery is None:
                return
            if value is None:
                delivery.notes.pop(what, None)
            else:
                delivery.notes[what] = value

    def _noted(self, shard: int, raw: bytes, what: str) -> Any:
        with self._lock:
            delivery = self._delivery(shard, raw)
            return None if delivery is None else delivery.notes.get(what)

    def note_failure(self, shard: int, raw: bytes, error: str) -> None:
        self._note(shard, raw, "error", error)

    def last_failure(self, shard: int, raw: bytes) -> str:
        return str(self._noted(shard, raw, "error") or "")

    def note_write(self, shard: int, raw: bytes, condition: str | None) -> None:
        self._note(shard, raw, "write", condition)

    def noted_write(self, shard: int, raw: bytes) -> str | None:
        value = self._noted(shard, raw, "write")
        return None if value is None else str(value)

    def note_retry(self, shard: int, raw: bytes) -> tuple[int, float]:
        with self._lock:
            delivery = self._delivery(shard, raw)
            if delivery is None:
                return 1, 0.0
            retries, since = delivery.notes.get("retries", (0, time.monotonic()))
            delivery.notes["retries"] = (retries + 1, since)
            return retries + 1, time.monotonic() - since

    def retries(self, shard: int, raw: bytes) -> int:
        noted = self._noted(shard, raw, "retries")
        return int(noted[0]) if noted else 0

    # -- the doorbell -----------------------------------------------------------------

    def doorbell(self) -> Any:
        subscription = _Subscription(self)
        self._subscriptions.add(subscription)
        return subscription

    # -- dead letters past the broker's delivery limit ---------------------------------

    def _consume_dead(self, conn: Any) -> None:
        channel = self._dead_channel = conn.channel()
        channel.basic_qos(0, 16, False)
        generation = self._generation

        def delivered(message: Any) -> None:
            tag, headers = int(message.delivery_tag), message.headers or {}
            self._dead_work.put((generation, tag, _body(message), headers))

        channel.basic_consume(dead_queue(self.settings.namespace), callback=delivered)

    def _dead_letters(self) -> None:
        """(Its own thread: a store write.) Each message the broker dead-lettered becomes
        a ``poison`` dead letter, then is acknowledged."""
        while (work := self._dead_work.get()) is not None:
            generation, tag, raw, headers = work
            assert self._on_dead is not None
            try:
                self._on_dead(raw, headers)
            except Exception:
                log.exception("a message past the delivery limit could not be recorded")
                continue  # not acknowledged: the broker delivers it again later
            self._submit(functools.partial(self._ack_dead, tag, generation))

    def _ack_dead(self, tag: int, generation: int) -> None:
        if self._dead_channel is not None and generation == self._generation:
            self._dead_channel.basic_ack(tag)

    def close(self) -> None:
        """Send what is queued (acknowledgements, handoffs), then disconnect."""
        if self._connection is not None and self._thread.is_alive():
            self._submit(self._stop.set)
        else:
            self._stop.set()
        self._dead_work.put(None)
        self._thread.join(10)
        self._dead_thread.join(5)
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def _batch_limit(tag: str) -> int:
    """How many messages of one record may go together (``<limit>:<digest>``)."""
    if not tag:
        return 1
    try:
        return max(1, int(tag.partition(":")[0]))
    except ValueError:
        return 1


def _body(message: Any) -> bytes:
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


def _ack(channel: Any, tags: Sequence[int]) -> None:
    # A channel closed since (a handoff, a lost connection) gave its deliveries back: an
    # ack there is void, and raising would take the new connection down.
    if not channel.is_open:
        return
    for tag in tags:
        channel.basic_ack(tag)


def _close(channel: Any) -> None:
    with contextlib.suppress(Exception):
        channel.close()


def _round_trip(consumer: ShardConsumer, prefetch: int) -> None:
    if not consumer.alive or not consumer.channel.is_open:
        raise BrokerUnavailable("RabbitMQ: the shard's channel is gone")
    consumer.channel.basic_qos(0, prefetch, False)  # answered by qos-ok: a round trip


def _is_connection_error(exc: BaseException) -> bool:
    return isinstance(
        exc, (AmqpConnectionError, RecoverableConnectionError, OSError, socket.timeout)
    )


__all__ = [
    "RabbitLaneBroker",
    "declare_topology",
    "delete_topology",
]
