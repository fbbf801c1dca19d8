"""The operator's side of Redis. :class:`DeploymentView`: read-only views for ``keylane
status``, ``check`` and ``audit`` (who holds which shard lease, queue depths, the records in
flight and waiting, the live workers, the lease log and the counters).
:class:`RetentionRecords`: the one writer here, for the prune: it removes archived
lease-log entries and records the store's sizes and the last prune's figures.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from ..producers.state_reads import (
    flow_states,
    queue_flow_reads,
    queue_schedule_reads,
    schedule_states,
)
from ..routing import ShardMap
from ..routing.contract.destinations import FlowState
from ..routing.contract.message import event_of
from ..routing.contract.replies import reply_int, reply_text
from ..routing.contract.schedule_state import ScheduleState
from ..routing.redis_keys import RedisKeys
from ..workers.brokers.redis import RedisLaneBroker, broker_errors


class DeploymentView:
    """Snapshots of one namespace's lanes in Redis."""

    #: Whether the broker logs every lease change (``keylane audit`` reads the log).
    keeps_lease_log = True

    def __init__(self, client: redis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys, shards: ShardMap) -> DeploymentView:
        """Connect to Redis at ``url`` (with timeouts: a dead server is an error)."""
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        return cls(client, keys, shards)

    def ping(self) -> bool:
        """Whether Redis answers (raises :class:`BrokerUnavailable` when it does not)."""
        with broker_errors():
            return bool(self.client.ping())

    def lease_values(self) -> dict[int, str]:
        """The lease value (``worker/token``) of every held shard, by shard."""
        names = [self.keys.lease(s) for s in range(self.shards.count)]
        with broker_errors():
            values: Any = self.client.mget(names)
        return {s: reply_text(v) for s, v in enumerate(values) if v is not None}

    def depth(self, shard: int) -> int:
        """Messages of the shard not yet acknowledged: in its queue, and admitted into its
        records' lists (those of held records not counted)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)  # one instant: admission moves messages
        pipe.llen(k.queue(self.shards.queue_name(shard)))
        pipe.hget(k.depth, str(shard))
        with broker_errors():
            queued, admitted = pipe.execute()
        return reply_int(queued) + reply_int(admitted)

    def shard_states(self) -> list[dict[str, Any]]:
        """Per shard: lease holder, fencing counter, depth (queued and admitted), records in
        flight and waiting, head message of the queue."""
        k = self.keys
        now_ms = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=True)  # one instant: admission moves messages
        for shard in range(self.shards.count):
            queue = k.queue(self.shards.queue_name(shard))
            pipe.get(k.lease(shard))
            pipe.pttl(k.lease(shard))
            pipe.get(k.fence(shard))
            pipe.llen(queue)
            pipe.hget(k.depth, str(shard))
            pipe.hlen(k.busy(shard))
            pipe.zcount(k.ready(shard), f"({now_ms}", "+inf")
            pipe.lindex(queue, -1)
        with broker_errors():
            raw = pipe.execute()
        out = []
        n = 8
        for shard in range(self.shards.count):
            holder, ttl, fence, queued, admitted, busy, waiting, head = raw[
                shard * n : shard * n + n
            ]
            out.append(
                {
                    "shard": shard,
                    "queue": self.shards.queue_name(shard),
                    "holder": reply_text(holder) or None,
                    "lease_ttl_ms": int(ttl) if holder is not None else None,
                    "fence": int(fence or 0),
                    "depth": int(queued) + reply_int(admitted),
                    "in_flight": int(busy),
                    "waiting": int(waiting),
                    "head": head,
                }
            )
        return out

    def records(self, shards: list[int]) -> list[dict[str, Any]]:
        """The records of ``shards`` that are in flight or waiting, and every held record:
        why a record waits (the error or the limit), its attempts, when it is due again,
        and how many of its events wait in its list."""
        k = self.keys
        now_ms = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            pipe.hgetall(k.busy(shard))
            pipe.zrangebyscore(k.ready(shard), f"({now_ms}", "+inf", withscores=True)
            pipe.hgetall(k.waits(shard))
        pipe.hgetall(k.held)
        with broker_errors():
            raw = pipe.execute()
        found: list[dict[str, Any]] = []
        for i, shard in enumerate(shards):
            busy, waiting, why = raw[3 * i : 3 * i + 3]
            for key, ms in busy.items():
                found.append(
                    {
                        "shard": shard,
                        "record_key": reply_text(key),
                        "state": "in_flight",
                        "since": int(ms) / 1000,
                    }
                )
            for key, score in waiting:
                detail = json.loads(why.get(key) or b"{}")
                found.append(
                    {
                        "shard": shard,
                        "record_key": reply_text(key),
                        "state": "waiting",
                        "reason": detail.get("reason"),
                        "error": detail.get("error") or None,
                        "attempts": detail.get("attempts"),
                        "since": detail.get("at"),
                        "due_in_s": round(max(0.0, score - now_ms) / 1000, 3),
                    }
                )
        for key, dead_letter_id in raw[-1].items():
            record_key = reply_text(key)
            shard = self.shards.shard_for_key(record_key)
            found.append(
                {
                    "shard": shard,
                    "record_key": record_key,
                    "state": "held",
                    "dead_letter": int(dead_letter_id),
                }
            )
        pipe = self.client.pipeline(transaction=False)
        for record in found:
            key = k.record(record["shard"], record["record_key"])
            pipe.llen(key)
            pipe.lindex(key, 0)
        with broker_errors():
            replies = pipe.execute()
        for i, record in enumerate(found):
            length, head = replies[2 * i], replies[2 * i + 1]
            record["behind"] = max(0, int(length) - 1)  # events of the record after its head
            record.update(head_event(head))
        return found

    def members(self) -> list[dict[str, Any]]:
        """Live and recently seen workers with their last heartbeat."""
        k = self.keys
        with broker_errors():
            entries: Any = self.client.zrange(k.members, 0, -1, withscores=True)
            infos: list[Any] = [
                self.client.hget(k.member(reply_text(m)), "info") for m, _ in entries
            ]
        return [
            {
                "worker": reply_text(member),
                "heartbeat_ms": int(score),
                "info": json.loads(info) if info else {},
            }
            for (member, score), info in zip(entries, infos, strict=True)
        ]

    def admitted_counts(self) -> dict[int, tuple[int, int]]:
        """Per shard: admitted messages as the ``depth`` hash counts them, and as the
        records' lists hold them (read only, at one instant per shard)."""
        return RedisLaneBroker(self.client, self.keys, self.shards).admitted_counts()

    def lease_events(self) -> list[dict[str, str]]:
        """The lease log, oldest first (trimmed to about the last 100,000 events)."""
        with broker_errors():
            entries: Any = self.client.xrange(self.keys.lease_log, "-", "+")
        return [
            {
                "id": reply_text(entry_id),
                **{reply_text(k): reply_text(v) for k, v in fields.items()},
            }
            for entry_id, fields in entries
        ]

    def counters(self) -> dict[str, int]:
        """The deployment's counters."""
        with broker_errors():
            raw: Any = self.client.hgetall(self.keys.counters)
        return {reply_text(k): int(v) for k, v in raw.items()}

    def backlog(self) -> dict[str, int]:
        """Each source's events accepted and not finished yet (fair admission's weights;
        a negative count, left by an event no accept counted, shows as none)."""
        with broker_errors():
            raw: Any = self.client.hgetall(self.keys.backlog)
        return {reply_text(k): max(0, int(v)) for k, v in raw.items() if int(v) > 0}

    def destinations(self) -> list[FlowState]:
        """Every destination's flow control: calls in flight, limits, next token, counters."""
        with broker_errors():
            members: Any = self.client.smembers(self.keys.destinations)
            names = sorted(reply_text(n) for n in members)
            pipe = self.client.pipeline(transaction=False)
            queue_flow_reads(pipe, self.keys, names)
            return flow_states(pipe.execute(), names)

    def schedules(self) -> list[ScheduleState]:
        """Every scheduled job's state: its definition, the run in progress, the buffered
        tick, the last run, the next tick, its tick and run counters."""
        with broker_errors():
            members: Any = self.client.smembers(self.keys.schedules)
            names = sorted(reply_text(n) for n in members)
            pipe = self.client.pipeline(transaction=False)
            queue_schedule_reads(pipe, self.keys, names)
            return schedule_states(pipe.execute(), names)

    def schedule_log(self, count: int | None = None) -> list[dict[str, str]]:
        """The scheduled jobs' run log (started, finished, interrupted, skipped, buffered,
        missed), oldest first; the last ``count`` entries when given."""
        with broker_errors():
            if count is None:
                entries: Any = self.client.xrange(self.keys.schedule_log, "-", "+")
            else:
                newest: Any = self.client.xrevrange(self.keys.schedule_log, count=count)
                entries = list(reversed(newest))
        return [
            {
                "id": reply_text(entry_id),
                **{reply_text(k): reply_text(v) for k, v in fields.items()},
            }
            for entry_id, fields in entries
        ]

    def door_page(
        self, source: str, before: str, oldest: str, count: int
    ) -> list[tuple[str, dict[bytes, bytes]]]:
        """Up to ``count`` refusals kept for ``source`` (``routing/contract/door.py``),
        newest first, from ``before`` (an XREVRANGE bound: ``+``, or ``(<id>`` to leave it
        out) down to ``oldest``."""
        with broker_errors():
            entries: Any = self.client.xrevrange(self.keys.door(source), before, oldest, count)
        return [(reply_text(entry_id), fields) for entry_id, fields in entries]

    def door_entry(self, source: str, entry_id: str) -> dict[bytes, bytes] | None:
        """The refusal kept for ``source`` as ``entry_id``, or None (trimmed, or never)."""
        with broker_errors():
            entries: Any = self.client.xrange(self.keys.door(source), entry_id, entry_id)
        return dict(entries[0][1]) if entries else None

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()


class RetentionRecords:
    """The prune's part of Redis: the lease log's old entries, and its figures."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys) -> RetentionRecords:
        """Connect to Redis at ``url`` (with timeouts: a dead server is an error)."""
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        return cls(client, keys)

    def lease_entries_before(self, before_ms: int, count: int) -> list[dict[str, str]]:
        """Up to ``count`` lease-log entries written before ``before_ms``, oldest first,
        each with its stream ``id``."""
        if before_ms <= 0:
            return []
        with broker_errors():
            entries: Any = self.client.xrange(
                self.keys.lease_log, "-", str(before_ms - 1), count=count
            )
        return [
            {"id": reply_text(entry_id), **{reply_text(k): reply_text(v) for k, v in f.items()}}
            for entry_id, f in entries
        ]

    def delete_lease_entries(self, ids: list[str]) -> int:
        """Remove archived entries from the lease log (an entry already gone is skipped)."""
        if not ids:
            return 0
        with broker_errors():
            return reply_int(self.client.xdel(self.keys.lease_log, *ids))

    def lease_log_age(self) -> tuple[int, float | None]:
        """The lease log's entries, and the time of its oldest (None: empty)."""
        with broker_errors():
            length = reply_int(self.client.xlen(self.keys.lease_log))
            first: Any = self.client.xrange(self.keys.lease_log, "-", "+", count=1)
        oldest = int(reply_text(first[0][0]).split("-")[0]) / 1000 if first else None
        return length, oldest

    def record(self, figures: dict[str, float], totals: dict[str, int], absent: list[str]) -> None:
        """Record the store's sizes and the last prune: ``figures`` replace the previous
        ones, ``absent`` ones are removed, ``totals`` are added to the running counts."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.keys.retention, mapping={k: repr(float(v)) for k, v in figures.items()})
        if absent:
            pipe.hdel(self.keys.retention, *absent)
        for name, amount in totals.items():
            pipe.hincrby(self.keys.retention, name, amount)
        with broker_errors():
            pipe.execute()

    def figures(self) -> dict[str, float]:
        """What the last prune recorded (empty before the first)."""
        with broker_errors():
            raw: Any = self.client.hgetall(self.keys.retention)
        return {reply_text(k): float(v) for k, v in raw.items()}

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()


def head_event(raw: bytes | None) -> dict[str, Any]:
    """The event at a record's head (in flight, waiting or holding it up): which one, and
    when it was accepted."""
    event = event_of(raw)
    if event is None:
        return {"event": None, "accepted_at": None}
    accepted_at = event.get("accepted_at")
    return {
        "event": f"{event.get('source')}/{event.get('event_id')}",
        "accepted_at": accepted_at if isinstance(accepted_at, int | float) else None,
    }
