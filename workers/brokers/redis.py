"""The lanes' broker on Redis: the worker side's one gateway to Redis (leases, records,
membership, the SQLite writer claim, counters, destinations' flow control). This module
is its records' queue; the leases and membership are :mod:`.redis_leases`, the notes
kept with a message :mod:`.redis_notes`, how it calls Redis :mod:`.redis_calls`.

Why keylane does not let kombu's Redis consumer read the shard queues (facts.md): kombu
pops with ``BRPOP`` and only afterwards records the message as unacknowledged, so a
``kill -9`` between the two loses it; a restored or rejected message can land at the tail;
a message read for a cancelled queue is requeued at the tail. Each of those breaks
per-record order or exactly-once. Here every step is one Lua script (``redis/*.lua``, the
key layout at the top of ``redis/_shared.lua``, loaded by name as
:mod:`keylane.routing.contract.redis_scripts` says):

* **take**: under the shard's lease, admit the shard queue's new messages into their
  records' lists, then hand out the first due record (its list's head, and a batch behind
  it) and mark it busy;
* **finish**: under the lease, drop the acknowledged messages from the record's list,
  count them, and either hold the record, or leave it due again, or hand the lane its next
  message (then the shard's next due record);
* **wait**: under the lease, the record stops being busy and is due again later;
* **acquire**: take the lease if free, advance the fencing token, and make every record a
  previous owner left busy due again (each at its place in its own list).

The shard queue itself stays an ordinary Celery queue (kombu's list at ``<ns>:<queue>``),
which receivers push to and Flower reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from ...routing import ShardMap
from ...routing.contract.message import build_unhold_message
from ...routing.contract.redis_scripts import COMMON_KEYS, SHARD_KEYS
from ...routing.contract.replies import reply_text
from ...routing.contract.settings import Settings
from ...routing.contract.tallies import Increment, Tally
from ...routing.redis_keys import (
    ONCE_MARKER_TTL_MS,
    SEND_MARKER_TTL_MS,
    RedisKeys,
    latency_bucket,
)
from ..broker import Ack, Counts, Idle, Lease, Outgoing, RecordQueue, Taken, Tell
from ..flow import DestinationFlow
from .redis_calls import broker_errors, call, script_text
from .redis_leases import RedisShardLeases
from .redis_notes import RedisMessageNotes

#: Messages a take or finish moves from the shard queue into records' lists at most (a
#: bound on one script's time; the next call admits more).
ADMIT_MAX = 64


class RedisLaneBroker(RedisShardLeases, RedisMessageNotes, RecordQueue):
    """The lane broker on Redis, every role of :mod:`keylane.workers.broker` (the lanes'
    :class:`RecordQueue`, the ownership's :class:`ShardLeases`, :class:`MessageNotes`),
    through redis-py's connection pool (thread-safe)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        super().__init__(client, keys, shards)
        #: Each shard's keys, built once: every take and finish sends them.
        self._shard_keys_of: dict[int, list[str]] = {}
        #: Destinations' flow control, shared by every worker (its own module).
        self.flow = DestinationFlow(keys, self._run)
        #: The acknowledged messages' counts (outcomes, the latency histogram, each
        #: shard's drain count), written by :meth:`flush_counts`, not by each finish.
        self.tally = Tally()

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys, shards: ShardMap) -> RedisLaneBroker:
        """Connect to Redis at ``url``, with timeouts so a dead server is an error."""
        client = redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=15
        )
        return cls(client, keys, shards)

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisLaneBroker:
        """The lane broker on ``settings``' Redis."""
        return cls.from_url(settings.redis_dsn(), settings.keys, settings.shards)

    def queue_key(self, shard: int) -> str:
        """The Redis list of the shard's Celery queue."""
        return self.keys.queue(self.shards.queue_name(shard))

    def _shard_keys(self, shard: int) -> list[str]:
        keys = self._shard_keys_of.get(shard)
        if keys is None:
            keys = self._shard_keys_of[shard] = self._build_shard_keys(shard)
        return keys

    def _build_shard_keys(self, shard: int) -> list[str]:
        # By name, in the order SHARD_KEYS gives the Lua side: a key added there and not
        # here fails at once (KeyError), never shifts a position.
        k = self.keys
        named = {
            "lease": k.lease(shard),
            "queue": self.queue_key(shard),
            "rec_prefix": k.record_prefix(shard),
            "ready": k.ready(shard),
            "busy": k.busy(shard),
            "waits": k.waits(shard),
            "deliveries": k.deliveries(shard),
        }
        return [named[name] for name in SHARD_KEYS]

    def _common_keys(self) -> list[str]:
        return [getattr(self.keys, name) for name in COMMON_KEYS]

    # -- records -----------------------------------------------------------------------

    def take(self, leases: Sequence[Lease]) -> Taken | Idle:
        keys: list[str] = []
        args: list[Any] = [ADMIT_MAX]
        for lease in leases:
            keys += self._shard_keys(lease.shard)
            args += [lease.shard, lease.value]
        reply = self._run("take", keys + self._common_keys(), args)
        if int(reply[0]) > 0:
            return _taken(leases[int(reply[0]) - 1].shard, reply[1:])
        due = {lease.shard: int(ms) / 1000 for lease, ms in zip(leases, reply[1:], strict=True)}
        return Idle({shard: s for shard, s in due.items() if s >= 0})

    def finish(
        self,
        lease: Lease,
        taken: Taken,
        acks: Sequence[Ack],
        hold: int | None = None,
        then_take: bool = False,
    ) -> Taken | Idle | bool:
        k = self.keys
        keys = [*self._shard_keys(lease.shard), k.latency, *self._common_keys()]
        args: list[Any] = [
            lease.shard,
            lease.value,
            taken.record_key,
            "" if hold is None else hold,
            "1" if then_take else "0",
            ADMIT_MAX,
            k.outcomes,
        ]
        reply = self._run("finish", keys, args + self._ack_args(acks, counted=False))
        if reply != 0:  # the lease was ours: the messages were acknowledged
            self.tally.add_all(self._counts(lease.shard, acks))
        if isinstance(reply, list) and len(reply) == 1:  # then_take: nothing due
            due_ms = int(reply[0])
            return Idle({lease.shard: due_ms / 1000} if due_ms >= 0 else {})
        if isinstance(reply, list):
            return _taken(lease.shard, reply)
        return bool(reply)

    def _ack_args(
        self, acks: Sequence[Ack], counted: bool = True, with_messages: bool = True
    ) -> list[Any]:
        """The values ``ACK`` names for each acknowledged message, in order (what
        ``finish.lua`` and ``after_ack.lua`` count and tell); without ``counted`` no
        outcome or latency for the script to count (the tally counts them); without
        ``with_messages``, an empty string in each message's place."""
        args: list[Any] = []
        for ack in acks:
            latency_s, tell = ack.latency_s, ack.tell
            args += [
                ack.raw if with_messages else "",
                ack.outcome if counted else "",
                ack.conflicts,
                ack.attempts,
                "" if latency_s is None or not counted else latency_bucket(latency_s),
                f"{latency_s or 0.0:.6f}",
                *(("", "", 0, "0") if tell is None else self._told(tell)),
                ack.backlog_source,
            ]
        return args

    def _counts(self, shard: int, acks: Sequence[Ack]) -> list[Increment]:
        """What acknowledging ``acks`` adds to the counters: each message drained from
        ``shard``, its outcome, conflicts and attempts, and its latency in the histogram."""
        k = self.keys
        counts = [Increment(k.drained, str(shard), len(acks))]
        for ack in acks:
            if not ack.outcome:
                continue
            counts.append(Increment(k.counters, ack.outcome, 1))
            if ack.conflicts > 0:
                counts.append(Increment(k.counters, "conflicts", ack.conflicts))
            if ack.attempts > 0:
                counts.append(Increment(k.counters, "attempts", ack.attempts))
            if ack.latency_s is not None:
                counts += [
                    Increment(k.latency, latency_bucket(ack.latency_s), 1),
                    Increment(k.latency, "count", 1),
                    Increment(k.latency, "sum", float(ack.latency_s)),
                ]
        return counts

    def flush_counts(self) -> None:
        """Add the counts the finishes kept in :attr:`tally` to the deployment's hashes,
        in one pipeline; on a Redis error they are kept for the next flush."""
        with self.tally.taken() as increments:
            if not increments:
                return
            pipe = self.client.pipeline(transaction=False)
            for inc in increments:  # one command per hash field that moved
                if isinstance(inc.amount, float):
                    pipe.hincrbyfloat(inc.key, inc.field, inc.amount)
                else:
                    pipe.hincrby(inc.key, inc.field, inc.amount)
            call(pipe.execute)

    def _told(self, tell: Tell) -> tuple[str, bytes, int, str]:
        key = self.keys.outcome(tell.source, tell.event_id)
        return key, tell.body, tell.ttl_ms, "1" if tell.replace else "0"

    def after_ack(self, acks: Sequence[Ack]) -> None:
        """What :meth:`finish` does beside the acknowledgement, for the RabbitMQ broker
        through this Redis helper after its ack: count the outcomes (counters and the
        latency histogram) and keep and publish the told ones, as ``finish.lua`` does,
        in one script call (``after_ack.lua``)."""
        if not any(ack.outcome or ack.tell is not None for ack in acks):
            return
        k = self.keys
        args = self._ack_args(acks, with_messages=False)  # after_ack.lua reads none
        self._run("after_ack", [k.counters, k.latency], [k.outcomes, *args])

    def wait(
        self,
        lease: Lease,
        taken: Taken,
        delay_s: float,
        why: dict[str, Any],
        counts: Counts = "keep",
        messages: Sequence[bytes] = (),
    ) -> bool:
        keys = self._shard_keys(lease.shard) + self._common_keys()
        args: list[Any] = [
            lease.value,
            taken.record_key,
            max(0, round(delay_s * 1000)),
            json.dumps({**why, "at": time.time(), "due_at": time.time() + delay_s}),
            counts,
            *messages,
        ]
        return bool(self._run("wait", keys, args))

    def in_flight(self, shard: int) -> list[str]:
        return [reply_text(k) for k in call(lambda: self.client.hkeys(self.keys.busy(shard)))]

    def reclaim(self, lease: Lease, record_keys: Sequence[str], min_age_s: float) -> int:
        if not record_keys:
            return 0
        keys = self._shard_keys(lease.shard) + self._common_keys()
        args = [lease.value, round(min_age_s * 1000), *record_keys]
        return int(self._run("reclaim", keys, args))

    # -- held records (for triage) -------------------------------------------------------

    def held_by(self, record_key: str) -> int | None:
        """The dead letter holding ``record_key``, if any."""
        value = call(lambda: self.client.hget(self.keys.held, record_key))
        return int(value) if value is not None else None

    def queued(self, record_key: str) -> int:
        """Messages waiting in ``record_key``'s list (behind a hold, a wait, or in flight)."""
        key = self.keys.record(self.shards.shard_for_key(record_key), record_key)
        return int(call(lambda: self.client.llen(key)))

    def push_once(
        self, marker: str, shard: int, raw: bytes, marker_ttl_ms: int = ONCE_MARKER_TTL_MS
    ) -> bool:
        """Queue an operator's message unless ``marker`` was used before (a second retry
        of one dead letter queues nothing)."""
        return bool(
            self._run(
                "push_once",
                [self.keys.once(marker), self.queue_key(shard)],
                [raw, marker_ttl_ms, self.keys.doorbell, shard],
            )
        )

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            marker = f"send:{message.marker}"
            self.push_once(marker, message.shard, message.raw, SEND_MARKER_TTL_MS)

    # -- the audit -----------------------------------------------------------------------

    def admitted_counts(self) -> dict[int, tuple[int, int]]:
        """Per shard, its admitted messages as the ``depth`` hash counts them and as its
        records' lists hold them (read only: ``keylane audit`` compares the two)."""
        found: dict[int, list[str]] = {shard: [] for shard in range(self.shards.count)}
        head = self.keys.record_prefix(0).removesuffix("0:")  # what every shard's shares
        names = call(lambda: list(self.client.scan_iter(match=f"{head}*", count=1000)))
        for name in names:
            number, _, record_key = reply_text(name).removeprefix(head).partition(":")
            if number.isdigit() and int(number) in found:
                found[int(number)].append(record_key)
        counts: dict[int, tuple[int, int]] = {}
        for shard, record_keys in found.items():
            keys = self._shard_keys(shard) + self._common_keys()
            counted, listed = self._run("admitted", keys, [shard, *record_keys])
            counts[shard] = (int(counted), int(listed))
        return counts

    # -- membership and counters ---------------------------------------------------------

    def incr(self, counter: str, by: int = 1) -> None:
        """Add to one of the deployment's counters."""
        call(lambda: self.client.hincrby(self.keys.counters, counter, by))

    # -- the doorbell and stray messages -------------------------------------------------

    def doorbell(self) -> Any:
        with broker_errors():
            # Typed through a cast: redis-py left pubsub() and PubSub untyped before 8.2.
            open_pubsub = cast("Callable[..., Any]", self.client.pubsub)
            pubsub = open_pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self.keys.doorbell)
        return pubsub

    def release_closed(self, lease: Lease, record_key: str, dead_letter_id: int) -> None:
        """The hold is a field of ``held`` written beside the store's row, so a close can
        come between the row and the hold: the release triage would have sent goes
        through the shard queue now, at its head (admitted next; a second release meets
        no hold and is dropped)."""
        queue = self.shards.queue_name(lease.shard)
        self.give_back(lease.shard, build_unhold_message(record_key, dead_letter_id, queue))

    def give_back(self, shard: int, raw: bytes) -> None:
        """Put a shard message back at the head of its queue and ring the shard (a plain
        Celery consumer took it; only the shard's lanes may run it)."""
        self._run("give_back", [self.queue_key(shard)], [raw, self.keys.doorbell, shard])

    def close(self) -> None:
        self.client.close()


def _taken(shard: int, reply: Any) -> Taken:
    key, raw, deliveries, held, batch, due_ms = reply
    return Taken(
        shard,
        reply_text(key),
        bytes(raw),
        int(deliveries),
        bool(int(held)),
        tuple(bytes(m) for m in batch),
        None if int(due_ms) < 0 else int(due_ms) / 1000,
    )


__all__ = ["RedisLaneBroker", "broker_errors", "script_text"]
