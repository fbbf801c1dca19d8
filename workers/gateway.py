"""The lanes' one gateway to Redis: leases, atomic take/ack of shard messages, held keys,
membership and counters. Nothing else on the worker side talks to Redis.

Why keylane does not let kombu's Redis consumer read the shard queues (facts.md):
kombu pops with ``BRPOP`` and only afterwards records the message as unacknowledged, so a
``kill -9`` between the two loses it; a restored or rejected message can land at the tail;
a message read for a cancelled queue is requeued at the tail. Each of those breaks
per-record order or exactly-once. Here every step is one Lua script:

* **take**: only while this worker's token is the shard's lease value and the shard has
  nothing in flight, ``LMOVE`` the head of the shard queue into the shard's in-flight list.
  A worker that lost its lease cannot take, even if it wakes up from a pause.
* **ack**: only while still the owner, remove the message from the in-flight list.
* **acquire**: take the lease if free, advance the shard's fencing counter, and put any
  message left in flight by the previous owner back at the head of the queue, in order.

The queue itself stays an ordinary Celery queue (kombu's list at ``<ns>:<queue>``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from ..routing import ShardMap
from ..routing.contract import redis_scripts as scripts
from ..routing.contract.destinations import EXCERPT_CHARS
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.replies import reply_text
from ..routing.redis_keys import RedisKeys, latency_bucket, message_digest
from .flow import DestinationFlow

LEASE_LOG_MAXLEN = 100_000


@contextlib.contextmanager
def broker_errors() -> Iterator[None]:
    """Turn any Redis error raised inside the block (sync or ``await``-ed) into
    :class:`BrokerUnavailable`: the rest of keylane sees one error for a Redis outage."""
    try:
        yield
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"Redis: {exc}") from exc


def run_script(script: Any, keys: list[str], args: list[Any]) -> Any:
    """Run a registered Lua script, Redis errors as :class:`BrokerUnavailable`."""
    with broker_errors():
        return script(keys=keys, args=args)


@dataclass(frozen=True)
class Lease:
    """A held lease: its value in Redis (``worker/token``) and the fencing token."""

    shard: int
    value: str
    token: int


@dataclass(frozen=True)
class Taken:
    """A message taken into a shard's in-flight slot."""

    shard: int
    raw: bytes
    resumed: bool  # it was already in flight (an earlier attempt did not finish)
    any_held: bool = False  # some record key is held behind an open dead letter
    deliveries: int = 1  # how many times this message has been handed to a lane
    #: Messages of the same record taken with it (first deliveries, in order), behind it
    #: in the in-flight list: see TAKE_MESSAGE.
    batch: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Ack:
    """A message done with: its outcome and counts (see :meth:`LaneGateway.ack`)."""

    raw: bytes
    outcome: str = ""
    conflicts: int = 0
    attempts: int = 0
    latency_s: float | None = None


@dataclass(frozen=True)
class Acquired:
    """The result of an acquisition attempt."""

    lease: Lease | None
    holder: str
    restored: int


class LaneGateway:
    """Typed access to the lane scripts. Thread-safe (redis-py's pool)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards
        self._acquire_lease = client.register_script(scripts.ACQUIRE_LEASE)
        self._renew_leases = client.register_script(scripts.RENEW_LEASES)
        self._release_lease = client.register_script(scripts.RELEASE_LEASE)
        self._take_message = client.register_script(scripts.TAKE_MESSAGE)
        self._ack_message = client.register_script(scripts.ACK_MESSAGE)
        self._requeue_batch = client.register_script(scripts.REQUEUE_BATCH)
        self._bump_fence = client.register_script(scripts.BUMP_FENCE)
        self._park_message = client.register_script(scripts.PARK_MESSAGE)
        self._unhold_key = client.register_script(scripts.UNHOLD_KEY)
        self._push_once = client.register_script(scripts.PUSH_ONCE)
        self._give_back = client.register_script(scripts.GIVE_BACK)
        self._note_retry = client.register_script(scripts.NOTE_RETRY)
        self._claim_or_renew = client.register_script(scripts.CLAIM_OR_RENEW)
        self._release_claim = client.register_script(scripts.RELEASE_CLAIM)
        #: Destinations' flow control, shared by every worker (its own module).
        self.flow = DestinationFlow(client, keys, run_script)

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys, shards: ShardMap) -> LaneGateway:
        """Connect to Redis at ``url``, with timeouts so a dead server is an error."""
        client = redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=15
        )
        return cls(client, keys, shards)

    def queue_key(self, shard: int) -> str:
        """The Redis list of the shard's Celery queue."""
        return self.keys.queue(self.shards.queue_name(shard))

    # -- leases ------------------------------------------------------------------------

    def acquire(self, shard: int, worker_id: str, ttl_ms: int) -> Acquired:
        """Take the shard's lease if it is free, restoring a dead owner's in-flight message."""
        k = self.keys
        ok, holder, restored = run_script(
            self._acquire_lease,
            [
                k.lease(shard),
                k.fence(shard),
                k.inflight(shard),
                self.queue_key(shard),
                k.lease_log,
                k.last_owner(shard),
            ],
            [worker_id, ttl_ms, shard, LEASE_LOG_MAXLEN],
        )
        holder = reply_text(holder)
        if not ok:
            return Acquired(None, holder, 0)
        token = int(holder.rsplit("/", 1)[1])
        return Acquired(Lease(shard, holder, token), holder, int(restored))

    def renew(self, leases: Sequence[Lease], ttl_ms: int) -> list[bool]:
        """Extend the leases still held; False for each one that was lost."""
        if not leases:
            return []
        result = run_script(
            self._renew_leases,
            [self.keys.lease(lease.shard) for lease in leases],
            [ttl_ms, *(lease.value for lease in leases)],
        )
        return [bool(x) for x in result]

    def release_lease(self, lease: Lease, worker_id: str, reason: str = "released") -> bool:
        """Give the lease up (only if still ours); logged as ``reason``."""
        k = self.keys
        return bool(
            run_script(
                self._release_lease,
                [k.lease(lease.shard), k.lease_log, k.last_owner(lease.shard)],
                [lease.value, lease.shard, reason, LEASE_LOG_MAXLEN, worker_id, lease.token],
            )
        )

    def log_lease_event(self, event: str, lease: Lease, worker_id: str) -> None:
        """Record a lease event seen only by the worker (e.g. ``lost``)."""
        fields: dict[FieldT, EncodableT] = {
            "event": event,
            "shard": lease.shard,
            "worker": worker_id,
            "token": lease.token,
            "restored": 0,
            "expired": "",
        }
        _do(lambda: self.client.xadd(self.keys.lease_log, fields, maxlen=LEASE_LOG_MAXLEN))

    def bump_fence(self, shard: int, at_least: int) -> int:
        """Raise the shard's fencing counter to ``at_least`` (after Redis lost data)."""
        return int(run_script(self._bump_fence, [self.keys.fence(shard)], [at_least]))

    # -- the SQLite store's one writer --------------------------------------------------

    def claim_store_writer(self, worker_id: str, ttl_ms: int, replacing: str = "") -> str:
        """Claim (or renew) being the store's one writer for ``ttl_ms``, or take the claim
        over from ``replacing`` (a holder known to be dead); returns the holder now."""
        return reply_text(
            run_script(
                self._claim_or_renew, [self.keys.store_writer], [worker_id, ttl_ms, replacing]
            )
        )

    def release_store_writer(self, worker_id: str) -> bool:
        """Give the writer claim up (only if still ours)."""
        return bool(run_script(self._release_claim, [self.keys.store_writer], [worker_id]))

    # -- messages ----------------------------------------------------------------------

    def take(self, leases: Sequence[Lease]) -> Taken | None:
        """The next message of the first of ``leases`` that has one, in that order.

        A shard whose in-flight slot is occupied returns that message again (``resumed``):
        the caller must therefore pass only shards that none of its own lanes is working
        on. Another worker's shards are never taken: the lease value must match.
        """
        if not leases:
            return None
        return self._taken(leases, run_script(self._take_message, *self._take_call(leases)))

    def _take_call(self, leases: Sequence[Lease]) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        for lease in leases:
            keys += [
                self.keys.lease(lease.shard),
                self.keys.inflight(lease.shard),
                self.queue_key(lease.shard),
                self.keys.deliveries(lease.shard),
            ]
        keys.append(self.keys.held)
        return keys, [lease.value for lease in leases]

    @staticmethod
    def _taken(leases: Sequence[Lease], result: Any) -> Taken | None:
        if result is None:
            return None
        index, raw, resumed, held_keys, deliveries, batch = result
        return Taken(
            leases[int(index) - 1].shard,
            bytes(raw),
            bool(resumed),
            int(held_keys) > 0,
            int(deliveries),
            tuple(bytes(m) for m in batch),
        )

    def ack(
        self,
        lease: Lease,
        raw: bytes,
        outcome: str = "",
        conflicts: int = 0,
        attempts: int = 0,
        latency_s: float | None = None,
    ) -> bool:
        """Drop the message from the in-flight slot if the lease is still ours, and count
        its ``outcome``, conflicts, attempts and latency (accepted to done)."""
        ack = Ack(raw, outcome, conflicts, attempts, latency_s)
        return bool(run_script(self._ack_message, *self._ack_call(lease, ack)))

    def ack_all(self, lease: Lease, acks: Sequence[Ack], then_take: bool = False) -> Taken | None:
        """:meth:`ack` for each of ``acks`` (a batch, in order) and, with ``then_take``,
        :meth:`take` from the lease's shard, in one round trip: the message taken next.
        (A lease lost meanwhile acknowledges and takes nothing, as the two calls would.)"""
        pipe = self.client.pipeline(transaction=False)
        for ack in acks:
            _eval(pipe, scripts.ACK_MESSAGE, *self._ack_call(lease, ack))
        if then_take:
            _eval(pipe, scripts.TAKE_MESSAGE, *self._take_call([lease]))
        replies = _do(pipe.execute)
        return self._taken([lease], replies[-1]) if then_take else None

    def _ack_call(self, lease: Lease, ack: Ack) -> tuple[list[str], list[Any]]:
        k = self.keys
        latency_s = ack.latency_s
        keys = [
            k.lease(lease.shard),
            k.inflight(lease.shard),
            k.deliveries(lease.shard),
            k.counters,
            k.latency,
            k.drained,
        ]
        args = [
            lease.value,
            ack.raw,
            ack.outcome,
            ack.conflicts,
            ack.attempts,
            "" if latency_s is None else latency_bucket(latency_s),
            f"{latency_s or 0.0:.6f}",
            lease.shard,
        ]
        return keys, args

    def park(self, lease: Lease, raw: bytes, record_key: str, retry_of: int | None) -> str:
        """``parked`` (the key is held: the message waits, in order, and leaves the
        in-flight slot), ``released`` (it is the retry of the holding dead letter: the
        parked messages now follow it), ``free`` (not held) or ``lost`` (not the owner)."""
        keys = [*self._hold_keys(lease, record_key), self.keys.counters]
        args = [lease.value, raw, record_key, "" if retry_of is None else str(retry_of)]
        return reply_text(run_script(self._park_message, keys, args))

    def hold(self, record_key: str, dead_letter_id: int) -> bool:
        """Hold ``record_key`` behind a dead letter (unless it is already held)."""
        return bool(
            _do(lambda: self.client.hsetnx(self.keys.held, record_key, str(dead_letter_id)))
        )

    def held_by(self, record_key: str) -> int | None:
        """The dead letter holding ``record_key``, if any."""
        value = _do(lambda: self.client.hget(self.keys.held, record_key))
        return int(value) if value is not None else None

    def parked_count(self, record_key: str) -> int:
        """Messages waiting behind the held ``record_key``."""
        return int(_do(lambda: self.client.llen(self.keys.parked(record_key))))

    def unhold_key(self, lease: Lease, raw: bytes, record_key: str, dead_letter_id: int) -> int:
        """Run an unhold control message: if ``dead_letter_id`` holds the key, its parked
        messages go to the head of the queue; the control message is acknowledged.
        Returns how many were released (-1: not the owner)."""
        keys = self._hold_keys(lease, record_key)
        args = [lease.value, raw, record_key, dead_letter_id]
        return int(run_script(self._unhold_key, keys, args))

    def _hold_keys(self, lease: Lease, record_key: str) -> list[str]:
        """KEYS[1..6] of the park and unhold scripts."""
        k = self.keys
        return [
            k.lease(lease.shard),
            k.inflight(lease.shard),
            k.held,
            k.parked(record_key),
            self.queue_key(lease.shard),
            k.deliveries(lease.shard),
        ]

    def push_once(
        self,
        marker: str,
        shard: int,
        raw: bytes,
        at_head: bool,
        marker_ttl_ms: int = 7 * 24 * 3600 * 1000,
    ) -> bool:
        """Queue an operator's message unless ``marker`` was used before (a second retry
        of one dead letter queues nothing). At the head, it runs next."""
        return bool(
            run_script(
                self._push_once,
                [self.keys.once(marker), self.queue_key(shard)],
                [raw, "head" if at_head else "tail", marker_ttl_ms, self.keys.doorbell, shard],
            )
        )

    def requeue(self, lease: Lease, raws: Sequence[bytes]) -> bool:
        """Put in-flight messages (a batch, in order) back at the head of the shard's
        queue as never delivered (see REQUEUE_BATCH); False if the lease is not ours."""
        k = self.keys
        keys = [k.lease(lease.shard), k.inflight(lease.shard), self.queue_key(lease.shard)]
        keys.append(k.deliveries(lease.shard))
        return bool(run_script(self._requeue_batch, keys, [lease.value, *raws]))

    def uncount_delivery(self, shard: int, *raws: bytes) -> None:
        """Take back one delivery count of each message (the attempt failed, or never
        started, for reasons not the event's)."""
        pipe = self.client.pipeline(transaction=False)
        for raw in raws:
            pipe.hincrby(self.keys.deliveries(shard), message_digest(raw), -1)
        _do(pipe.execute)

    def note_failure(self, shard: int, raw: bytes, error: str) -> None:
        """Remember why the last delivery failed (shown when it becomes a dead letter)."""
        self._note(shard, raw, "error", error[:EXCERPT_CHARS])

    def last_failure(self, shard: int, raw: bytes) -> str:
        """The error of the last failed delivery, if any."""
        return reply_text(self._noted(shard, raw, "error"))

    def note_write(self, shard: int, raw: bytes, condition: str | None) -> None:
        """Remember that a write of the shard's in-flight message is about to be sent,
        conditional on ``condition`` (None: no write is in doubt any more)."""
        self._note(shard, raw, "write", condition)

    def noted_write(self, shard: int, raw: bytes) -> str | None:
        """The condition of a write an earlier delivery sent without seeing its answer."""
        value = self._noted(shard, raw, "write")
        return None if value is None else reply_text(value)

    def retries(self, shard: int, raw: bytes) -> int:
        """Failed calls of the shard's in-flight message so far (see :meth:`note_retry`)."""
        return int(self._noted(shard, raw, "retries") or 0)

    def _note(self, shard: int, raw: bytes, what: str, value: str | None) -> None:
        """Keep ``value`` (None: forget it) with the shard's in-flight message, in its
        deliveries hash; acknowledging, parking or unholding the message forgets it."""
        key, field = self.keys.deliveries(shard), f"{message_digest(raw)}:{what}"
        if value is None:
            _do(lambda: self.client.hdel(key, field))
        else:
            _do(lambda: self.client.hset(key, field, value))

    def _noted(self, shard: int, raw: bytes, what: str) -> Any:
        """What :meth:`_note` kept (None if nothing)."""
        field = f"{message_digest(raw)}:{what}"
        return _do(lambda: self.client.hget(self.keys.deliveries(shard), field))

    def note_retry(self, shard: int, raw: bytes) -> tuple[int, float]:
        """Count one more failed call of the shard's in-flight message (apart from its
        delivery count): how many so far, and seconds since the first."""
        retries, since_ms = run_script(
            self._note_retry, [self.keys.deliveries(shard)], [message_digest(raw)]
        )
        return int(retries), int(since_ms) / 1000

    # -- membership and counters ---------------------------------------------------------

    def heartbeat(self, worker_id: str, info: dict[str, Any], member_ttl_ms: int) -> list[str]:
        """Record this worker as alive, drop members silent for ``member_ttl_ms``, and
        return the live members."""
        now_ms = int(time.time() * 1000)
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(k.members, {worker_id: now_ms})
        pipe.hset(k.member(worker_id), mapping={"info": json.dumps(info), "seen_ms": now_ms})
        pipe.pexpire(k.member(worker_id), member_ttl_ms * 10)
        pipe.zremrangebyscore(k.members, 0, now_ms - member_ttl_ms)
        pipe.zrange(k.members, 0, -1)
        result = _do(pipe.execute)
        return [reply_text(m) for m in result[-1]]

    def leave(self, worker_id: str) -> None:
        """Remove this worker from the members (graceful stop)."""
        _do(lambda: self.client.zrem(self.keys.members, worker_id))

    def incr(self, counter: str, by: int = 1) -> None:
        """Add to one of the deployment's counters."""
        _do(lambda: self.client.hincrby(self.keys.counters, counter, by))

    # -- the doorbell and stray messages -------------------------------------------------

    def doorbell(self) -> Any:
        """A pub/sub subscription to the doorbell channel (shard numbers of queues that
        just got a message); the caller reads it with ``get_message`` and closes it."""
        with broker_errors():
            # Typed through a cast: redis-py left pubsub() and PubSub untyped before 8.2.
            open_pubsub = cast("Callable[..., Any]", self.client.pubsub)
            pubsub = open_pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self.keys.doorbell)
        return pubsub

    def give_back(self, shard: int, raw: bytes) -> None:
        """Put a shard message back at the head of its queue and ring the shard (a plain
        Celery consumer took it; only the shard's lane may run it)."""
        run_script(self._give_back, [self.queue_key(shard)], [raw, self.keys.doorbell, shard])

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()


def _eval(pipe: Pipeline, script: str, keys: list[str], args: list[Any]) -> None:
    """Queue ``script`` on ``pipe`` as EVAL with its text: Redis runs its cached copy,
    and no NOSCRIPT can come back. (Queued as a registered ``Script``, redis-py first
    asks Redis whether the script is loaded: a second round trip for every pipeline.)"""
    pipe.eval(script, len(keys), *keys, *args)


def _do(fn: Callable[[], Any]) -> Any:
    with broker_errors():
        return fn()


__all__ = ["Ack", "Acquired", "LaneGateway", "Lease", "Taken"]
