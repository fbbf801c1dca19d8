"""The scheduler's gateway to Redis: each job's step, its run's lease, the end of a run and
the run log, each one script (``scripts/schedule_*.lua``, ``*_run_lease.lua``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from ...routing.contract.destinations import EXCERPT_CHARS
from ...routing.contract.replies import reply_text
from ...routing.contract.schedules import RunLease
from ...routing.redis_keys import RedisKeys
from .redis_calls import LoadedScript, broker_errors, run_script, script_text


@dataclass(frozen=True)
class StepReply:
    """What one step of a job did (see ``SCHEDULE_STEP``): ``start`` (this caller runs
    ``tick`` under ``token``), ``none``, ``stale`` (the caller's last tick was out of date)
    or ``busy`` (a manual run found one going, by ``owner``)."""

    kind: Literal["start", "none", "stale", "busy"]
    last_tick: str
    tick: int = 0
    token: int = 0
    attempt: int = 1
    since: int | None = None
    owner: str = ""


class ScheduleGateway:
    """Typed access to Redis for the scheduler (asyncio): each job's step, its run's
    lease, the end of a run, and the run log, each one script."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys, log_max: int = 100_000) -> None:
        self.client = client
        self.keys = keys
        self.log_max = log_max
        self._step = LoadedScript(script_text("schedule_step"))
        self._finish = LoadedScript(script_text("schedule_finish"))
        self._renew = LoadedScript(script_text("renew_run_lease"))
        self._release = LoadedScript(script_text("release_run_lease"))

    @classmethod
    def from_url(cls, url: str, keys: RedisKeys) -> ScheduleGateway:
        """Connect to Redis at ``url``, with timeouts so a dead server is an error."""
        client = aioredis.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=15
        )
        return cls(client, keys)

    async def now_ms(self) -> int:
        """Redis's clock: every scheduler process judges ticks by the same one."""
        with broker_errors():
            seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def register(self, job: str, definition: dict[str, Any], now_ms: int) -> str:
        """Make ``job`` known (listed, its definition shown); a job seen for the first
        time starts at its first tick after ``now_ms``. Returns its last tick."""
        state = self.keys.schedule(job)
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(self.keys.schedules, job)
        pipe.hset(state, "def", json.dumps(definition, sort_keys=True))
        pipe.hsetnx(state, "last_tick", str(now_ms))
        pipe.hget(state, "last_tick")
        with broker_errors():
            replies = await pipe.execute()
        return reply_text(replies[-1])

    async def set_next(self, job: str, tick_ms: int | None) -> None:
        """Note the job's next tick, for listings."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.schedule(job), "next_tick", str(tick_ms or ""))
        with broker_errors():
            await pipe.execute()

    async def step(
        self,
        job: str,
        owner: str,
        ttl_ms: int,
        due: int | None,
        missed: int,
        last_tick: str,
        overlap: str,
        on_interrupted: str,
        mode: Literal["tick", "manual"] = "tick",
    ) -> StepReply:
        """One step of ``job`` (see ``SCHEDULE_STEP``)."""
        keys = [self.keys.schedule(job), self.keys.schedule_lease(job), self.keys.schedule_log]
        args = [owner, ttl_ms, job, "" if due is None else due, missed, last_tick]
        args += [overlap, on_interrupted, self.log_max, mode]
        reply = [reply_text(x) for x in await self._run(self._step, keys, args)]
        kind, last = reply[0], reply[1]
        if kind == "start":
            since = int(reply[5]) if reply[5] else None
            return StepReply("start", last, int(reply[2]), int(reply[3]), int(reply[4]), since)
        if kind == "busy":
            return StepReply("busy", last, owner=reply[2])
        return StepReply(kind, last)  # type: ignore[arg-type]

    async def renew(self, lease: RunLease, ttl_ms: int) -> bool:
        """Extend the run's lease, if it still holds it."""
        return bool(await self._run(self._renew, [lease.key], [lease.value, ttl_ms]))

    async def finish(
        self,
        lease: RunLease,
        tick: int,
        token: int,
        outcome: str,
        error: str,
        sent: int,
        duplicates: int,
    ) -> bool:
        """Record the end of a run and free its lease; False if the lease was no longer
        the run's (it was taken over: nothing is recorded)."""
        job = lease.job
        keys = [self.keys.schedule(job), lease.key, self.keys.schedule_log]
        args = [lease.value, outcome, error[:EXCERPT_CHARS], sent, duplicates, tick, job, token]
        return bool(await self._run(self._finish, keys, [*args, self.log_max]))

    async def release(self, lease: RunLease) -> bool:
        """Give a run's lease up before it finished (a scheduler stopping): the next
        step of any scheduler finds the run interrupted."""
        return bool(await self._run(self._release, [lease.key], [lease.value]))

    async def close(self) -> None:
        """Release the connection pool."""
        await self.client.aclose()

    async def _run(self, script: LoadedScript, keys: list[str], args: list[Any]) -> Any:
        return await run_script(self.client, script, keys, args)
