"""The receiver's one gateway to Redis: the accept script, the review message of a reused
id, the dedupe marks and told outcomes, and (:attr:`ReceiverGateway.reads`,
:mod:`.queue_reads`) the reads behind backpressure and ``/metrics``.

Accepting an event into its shard queue and marking its id as seen is ONE Lua script
(``scripts/accept.lua``, beside this module), and so is accepting every event of a batched
delivery (HubSpot's array, Meta's changes, Salesforce's notifications): all of them, or
none. Invariant 1 needs the push and the mark to be inseparable. If the mark came first, a
receiver that dies before pushing would leave a mark that swallows the sender's retry; if
the push came first, a receiver that dies before marking would let the retry enqueue a
second copy. In one script, Redis runs both or neither, and a concurrent duplicate waits
behind the first and then sees its mark. With ``appendfsync always`` (what ``keylane up``
configures) Redis writes the script's effects to its append-only file before it replies,
so a 202 is sent only for an event that survives a Redis crash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from ...routing import ShardMap
from ...routing.contract.replies import reply_text
from ...routing.contract.schedules import RunLease
from ...routing.contract.settings import DEFAULT_COUNTS_FLUSH_MS, Settings
from ...routing.redis_keys import RedisKeys, seen_id
from ..mark_batches import Mark, MarkBatches
from ..rounds import Rounds
from .accept_items import BatchResult, Enqueue, EnqueueResult, Verdict, batch_result
from .count_flush import CountFlush
from .door_log import DoorLog
from .outcome_feed import OutcomeFeed
from .queue_reads import QueueReads
from .redis_calls import LoadedScript, as_bytes, broker_errors, run_script, script_text

#: The most connections one process's gateway opens to Redis, and how long a call waits for
#: one when they are all busy (see :meth:`ReceiverGateway.from_url`).
POOL_CONNECTIONS = 100
POOL_WAIT_S = 5
#: Seconds a count waits at most before it is written (the default of ``counts_flush_ms``).
COUNTS_FLUSH_S = DEFAULT_COUNTS_FLUSH_MS / 1000

#: The counter each verdict of the accept script is counted in.
_COUNTED_AS = {
    "accepted": "accepted",
    "duplicate": "duplicate_deliveries",
    "reused": "reused_ids",
}

#: One delivery in a round of accepts: its events, its scheduled run's lease, its share.
_Delivery = tuple[tuple[Enqueue, ...], RunLease | None, int]


class ReceiverGateway:
    """Typed access to Redis for the receiver (asyncio)."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: RedisKeys,
        shards: ShardMap,
        counts_flush_s: float = COUNTS_FLUSH_S,
    ) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards
        #: The dedupe marks of the two-step accept (RabbitMQ) and the outcome reads, many
        #: requests' in one round trip.
        self.marks = MarkBatches(self.marks_round)
        #: The deployment's state as the queue watch, /metrics and the wire choice read it.
        self.reads = QueueReads(client, keys, shards)
        #: The deliveries turned away, kept per source.
        self.door = DoorLog(client, keys)
        self._mark_seen = LoadedScript(script_text("mark_seen"))
        self._accept = LoadedScript(script_text("accept"))
        #: The accepts of requests that arrive at once, in one script call.
        self._accepts: Rounds[_Delivery, BatchResult] = Rounds(self._accept_round)
        self._record_id_reuse = LoadedScript(script_text("record_id_reuse"))
        #: The accepts' counts (accepted, duplicates, refusals), written together.
        self.counts = CountFlush(client, counts_flush_s)
        self._outcome_of = LoadedScript(script_text("outcome_of"))

    @classmethod
    def from_url(
        cls, url: str, keys: RedisKeys, shards: ShardMap, counts_flush_s: float = COUNTS_FLUSH_S
    ) -> ReceiverGateway:
        """Connect to Redis at ``url``, with timeouts so a dead server is an error.

        The pool holds at most :data:`POOL_CONNECTIONS`, and a request that finds them all
        busy waits for one (up to the socket timeout) instead of failing: redis-py's own
        pool raises "Too many connections" past 100, which answered a burst of more
        deliveries at once 503 (found with 1,000 waiting requests,
        ``tests/test_sender_outcomes.py``)."""
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_CONNECTIONS,
            timeout=POOL_WAIT_S,
            socket_timeout=5,
            socket_connect_timeout=5,
            health_check_interval=15,
        )
        return cls(aioredis.Redis.from_pool(pool), keys, shards, counts_flush_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> ReceiverGateway:
        """The gateway to ``settings``' Redis."""
        flush_s = settings.counts_flush_ms / 1000
        return cls.from_url(settings.redis_dsn(), settings.keys, settings.shards, flush_s)

    @property
    def redis(self) -> ReceiverGateway:
        """Itself: on Redis the event queue and the marks are one (see
        :mod:`keylane.producers.broker`)."""
        return self

    async def accept(self, item: Enqueue, share: int = 0) -> EnqueueResult:
        """Push the message and mark its event id seen, unless already seen or the
        shard is at its high-water mark (its queue and what its owner took in), or (a
        ``lease``) the scheduled run that sends it no longer holds its lease (``fenced``),
        or its source is over its ``share`` of the backlog (``throttled``)."""
        return (await self.accept_batch([item], item.lease, share)).single()

    async def accept_batch(
        self, items: Sequence[Enqueue], lease: RunLease | None = None, share: int = 0
    ) -> BatchResult:
        """Accept a delivery's events: each pushed and marked seen unless seen before (a
        duplicate, or an id reused with another body), or none of them when a shard is at
        its high-water mark, the scheduled run's ``lease`` is lost, or they would take
        their source past ``share`` events waiting while another source's wait (0: no
        share) (``scripts/accept.lua``). Deliveries that arrive at once go in one script
        call (a round: :mod:`keylane.producers.rounds`), each decided on its own."""
        return await self._accepts.ask((tuple(items), lease, share))

    async def _accept_round(self, deliveries: list[_Delivery]) -> list[BatchResult | BaseException]:
        """One call of the accept script for ``deliveries``; a Redis error fails them all."""
        keys = [self.keys.counters, self.keys.depth, self.keys.backlog]
        first = deliveries[0][0][0]  # every delivery of a receiver has the deployment's marks
        args: list[Any] = [
            self.keys.doorbell,
            first.high_water,
            len(deliveries),
            first.global_high_water,
            first.outcome_keep_ms,
        ]
        for items, lease, share in deliveries:
            keys.append(self.keys.counters if lease is None else lease.key)
            args += ["" if lease is None else lease.value, len(items), items[0].source, share]
            for item in items:
                seen = seen_id(item.event_id, item.body_sha256)
                keys += [
                    self.keys.dedupe(item.source, item.event_id),
                    self.keys.queue(item.queue),
                    self.keys.outcome(item.source, item.event_id),
                    self.keys.seen_ids(item.source),
                ]
                args += [
                    item.body_sha256,
                    item.message,
                    item.retention_ms,
                    item.shard,
                    seen.slot,
                    seen.field,
                    seen.body,
                ]
        replies = await self._run(self._accept, keys, args)
        results = [
            batch_result(reply, items)
            for (items, _, _), reply in zip(deliveries, replies, strict=True)
        ]
        for (items, _, _), result in zip(deliveries, results, strict=True):
            self._count(items, result)
        return [*results]

    def _count(self, items: Sequence[Enqueue], result: BatchResult) -> None:
        """Count a delivery's verdicts (or its refusal) into :attr:`counts`."""
        counters = self.keys.counters
        if result.refused is not None:
            if result.refused != "fenced":
                name = "refused_full" if result.refused == "full" else result.refused
                self.counts.add(counters, name)
            return
        for item, got in zip(items, result.results, strict=True):
            self.counts.add(counters, _COUNTED_AS[got.verdict])
            if got.verdict == "accepted" and item.key_missing:
                self.counts.add(counters, "keyless")

    async def record_reuse(self, item: Enqueue) -> bool:
        """Queue ``message`` (the event, marked for review only) once per distinct body
        sent under a reused id (senders retry a 409)."""
        result = await self._run(
            self._record_id_reuse,
            [
                self.keys.reused(item.source, item.event_id, item.body_sha256),
                self.keys.queue(item.queue),
            ],
            [item.retention_ms, item.message, self.keys.doorbell, item.shard],
        )
        return bool(result)

    async def seen_all(self, events: Sequence[tuple[str, str, str]]) -> list[EnqueueResult | None]:
        """For each ``(source, event id, body digest)``, the verdict an earlier delivery's
        dedupe mark gives (``duplicate`` or ``reused``, with the first delivery's answer
        and a duplicate's told outcome), or None: the accept of a broker whose publish and
        mark are two steps (RabbitMQ, :mod:`keylane.producers.amqp`). The marks are read
        in one round, the duplicates and reuses counted in one pipeline."""
        keys: list[str] = []
        for source, event_id, _ in events:
            keys += [self.keys.dedupe(source, event_id), self.keys.outcome(source, event_id)]
        with broker_errors():
            values = await self.marks.read(*keys)
        found: list[EnqueueResult | None] = []
        counts: Counter[str] = Counter()
        for (_, _, body_sha256), value, told in zip(
            events, values[0::2], values[1::2], strict=True
        ):
            if value is None:
                found.append(None)
                continue
            digest, _, answer = reply_text(value).partition("\n")
            verdict: Verdict = "duplicate" if digest == body_sha256 else "reused"
            counts["duplicate_deliveries" if verdict == "duplicate" else "reused_ids"] += 1
            found.append(
                EnqueueResult(verdict, answer, as_bytes(told) if verdict == "duplicate" else None)
            )
        for counter, amount in counts.items():
            self.counts.add(self.keys.counters, counter, amount)
        return found

    async def mark_seen(
        self,
        source: str,
        event_id: str,
        body_sha256: str,
        answer: bytes,
        retention_ms: int,
        key_missing: bool = False,
    ) -> None:
        """Mark ``event_id`` seen (after its message was confirmed), unless a concurrent
        delivery of it marked it first; count it accepted."""
        key = self.keys.dedupe(source, event_id)
        mark = body_sha256.encode() + b"\n" + answer
        counts = {"accepted": 1, "keyless": 1} if key_missing else {"accepted": 1}
        with broker_errors():
            await self.marks.mark(Mark(key, mark, retention_ms, counts))

    async def marks_round(self, keys: list[str], marks: list[Mark]) -> tuple[Any, Any]:
        """One round of :class:`~keylane.producers.mark_batches.MarkBatches`, one pipeline:
        the values of ``keys`` (one ``MGET``) and ``marks`` written with their counts summed
        (one call of ``mark_seen.lua``); a command's error in place of its reply."""
        pipe = self.client.pipeline(transaction=False)
        if keys:
            pipe.mget(keys)
        if marks:
            pipe.evalsha(self._mark_seen.sha, *self._mark_seen_call(marks))
        replies = list(await pipe.execute(raise_on_error=False))
        values = replies.pop(0) if keys else []
        written = replies.pop(0) if marks else None
        if isinstance(written, NoScriptError):  # a restarted or flushed Redis
            client: Any = self.client  # typed alike on every redis-py keylane allows
            await client.script_load(self._mark_seen.script)
            written = await client.evalsha(self._mark_seen.sha, *self._mark_seen_call(marks))
        return values, written

    def _mark_seen_call(self, marks: list[Mark]) -> list[Any]:
        """``mark_seen.lua``'s key count, keys and arguments for ``marks``."""
        counts: Counter[str] = Counter()
        for mark in marks:
            counts.update(mark.counts)
        keys = [self.keys.counters, *(mark.key for mark in marks)]
        args: list[Any] = [len(counts)]
        for name, amount in counts.items():
            args += [name, amount]
        for mark in marks:
            args += [mark.value, mark.ttl_ms]
        return [len(keys), *keys, *args]

    async def outcome_of(
        self, source: str, event_id: str, retention_ms: int
    ) -> tuple[bytes | None, bool]:
        """The told outcome of an event (None until its lane decided it, or once it is
        no longer kept), and whether it was accepted (its id is remembered within
        ``retention_ms``, its source's), read together (``scripts/outcome_of.lua``)."""
        seen = seen_id(event_id)
        keys = [
            self.keys.outcome(source, event_id),
            self.keys.dedupe(source, event_id),
            self.keys.seen_ids(source),
        ]
        told, accepted = await self._run(
            self._outcome_of, keys, [seen.slot, seen.field, retention_ms]
        )
        return as_bytes(told) or None, bool(accepted)

    def outcome_feed(self) -> OutcomeFeed:
        """A new subscription to the told outcomes (the receiver's one, see
        :mod:`keylane.producers.outcome_waits`); connected by :meth:`OutcomeFeed.open`."""
        return OutcomeFeed(self.client, self.keys.outcomes)

    async def kept_secret(self, source: str) -> str | None:
        """The secret ``source``'s sender handed over in its handshake, if one is kept."""
        with broker_errors():
            value = await self.client.get(self.keys.hook_secret(source))
        return None if value is None else reply_text(value)

    async def keep_secret(self, source: str, secret: str) -> str:
        """Keep ``secret`` for ``source`` unless one is kept already; the secret kept."""
        key = self.keys.hook_secret(source)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(key, secret, nx=True)
        pipe.get(key)
        with broker_errors():
            _, kept = await pipe.execute()
        return reply_text(kept)

    async def forget_secret(self, source: str) -> bool:
        """Forget the secret kept for ``source`` (whether one was kept)."""
        with broker_errors():
            return bool(await self.client.delete(self.keys.hook_secret(source)))

    async def ping(self) -> bool:
        """Whether Redis answers."""
        try:
            return bool(await self.client.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        """Write the counts not written yet, and release the connection pool."""
        await self._accepts.close()
        await self.marks.close()
        await self.counts.close()
        await self.client.aclose()

    async def _run(self, script: LoadedScript, keys: list[str], args: list[Any]) -> Any:
        return await run_script(self.client, script, keys, args)
