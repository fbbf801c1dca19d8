"""The shard leases of the Redis lane broker (:class:`ShardLeases`): a lease taken,
renewed, released or lost, the fence advanced, the members' beats and the namespace's
layout; and the SQLite store's one writer, claimed in Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from redis.typing import EncodableT, FieldT

from ...routing.contract.errors import ConfigError
from ...routing.contract.replies import reply_text
from ..broker import Acquired, Lease, ShardLeases
from .redis_calls import RedisScripts, call

LEASE_LOG_MAXLEN = 100_000
#: The oldest Redis the lanes' scripts run on (``RPOP`` with a count is 6.2's).
OLDEST_REDIS = (6, 2)


def older_than_supported(version: str) -> bool:
    """Whether a Redis of ``version`` (``INFO server``'s ``redis_version``) is older than
    :data:`OLDEST_REDIS`."""
    major, minor, *_ = (int(part) for part in [*version.split(".")[:2], "0", "0"])
    return (major, minor) < OLDEST_REDIS


class RedisShardLeases(RedisScripts, ShardLeases):
    """Leases, fences, membership and the store writer's claim, each one script or one
    transaction."""

    def acquire(self, shard: int, worker_id: str, ttl_ms: int) -> Acquired:
        k = self.keys
        ok, holder, restored = self._run(
            "acquire",
            [
                k.lease(shard),
                k.fence(shard),
                k.busy(shard),
                k.ready(shard),
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
        if not leases:
            return []
        result = self._run(
            "renew",
            [self.keys.lease(lease.shard) for lease in leases],
            [ttl_ms, *(lease.value for lease in leases)],
        )
        return [bool(x) for x in result]

    def release_lease(self, lease: Lease, worker_id: str, reason: str = "released") -> bool:
        k = self.keys
        return bool(
            self._run(
                "release",
                [k.lease(lease.shard), k.lease_log, k.last_owner(lease.shard)],
                [lease.value, lease.shard, reason, LEASE_LOG_MAXLEN, worker_id, lease.token],
            )
        )

    def lose(self, lease: Lease, worker_id: str, why: str) -> None:
        # Nothing to let go of: the lease expires in Redis, and the next owner restores
        # the messages this worker had in flight. The lease log keeps the event.
        fields: dict[FieldT, EncodableT] = {
            "event": "lost",
            "shard": lease.shard,
            "worker": worker_id,
            "token": lease.token,
            "restored": 0,
            "expired": "",
        }
        call(lambda: self.client.xadd(self.keys.lease_log, fields, maxlen=LEASE_LOG_MAXLEN))

    def bump_fence(self, shard: int, at_least: int) -> int:
        return int(self._run("bump_fence", [self.keys.fence(shard)], [at_least]))

    # -- the SQLite store's one writer --------------------------------------------------

    def claim_store_writer(
        self, worker_id: str, ttl_ms: int, replacing: str = ""
    ) -> tuple[str, bool]:
        """Claim (or renew) being the store's one writer for ``ttl_ms``, or take the claim
        over from ``replacing`` (a holder known to be gone). Returns the holder after the
        call, and whether that holder's claim ran out without a release (it may be paused:
        the caller decides whether it is gone)."""
        k = self.keys
        holder, how = self._run(
            "claim", [k.store_writer, k.store_writer_last], [worker_id, ttl_ms, replacing]
        )
        return reply_text(holder), reply_text(how) == "expired"

    def release_store_writer(self, worker_id: str) -> bool:
        """Give the writer claim up (only if still ours)."""
        k = self.keys
        return bool(self._run("unclaim", [k.store_writer, k.store_writer_last], [worker_id]))

    # -- membership --------------------------------------------------------------------

    def heartbeat(self, worker_id: str, info: dict[str, Any], member_ttl_ms: int) -> list[str]:
        now_ms = int(time.time() * 1000)
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(k.members, {worker_id: now_ms})
        pipe.hset(k.member(worker_id), mapping={"info": json.dumps(info), "seen_ms": now_ms})
        pipe.pexpire(k.member(worker_id), member_ttl_ms * 10)
        pipe.zremrangebyscore(k.members, 0, now_ms - member_ttl_ms)
        pipe.zrange(k.members, 0, -1)
        result = call(pipe.execute)
        return [reply_text(m) for m in result[-1]]

    def check_server(self) -> None:
        """Refuse a Redis older than the lanes' scripts need, saying which it is."""
        found = str(call(lambda: self.client.info("server")).get("redis_version", "0"))
        if older_than_supported(found):
            oldest = ".".join(map(str, OLDEST_REDIS))
            raise ConfigError(
                f"Redis {found} is older than keylane's lanes need ({oldest} or newer: "
                "their scripts pop a queue with RPOP and a count); upgrade Redis"
            )

    def claim_layout(self, version: int) -> None:
        """Mark the namespace as laid out in ``version`` when nothing marks it (a
        namespace of keylane 0.1.0: layout 1), and refuse one a newer release laid out."""
        key = self.keys.layout
        pipe = self.client.pipeline(transaction=True)  # (SET NX GET needs Redis 7)
        pipe.set(key, version, nx=True)
        pipe.get(key)
        found = call(pipe.execute)[-1]
        if found is not None and int(found) > version:
            raise ConfigError(
                f"the Redis namespace {self.keys.namespace!r} is laid out by a newer keylane "
                f"(layout {int(found)}; this one reads {version}): upgrade this worker"
            )

    def leave(self, worker_id: str) -> None:
        call(lambda: self.client.zrem(self.keys.members, worker_id))
