"""The Celery baselines of the versus benchmark: a small Celery app as users write one.

Three ways to run the same read-modify-write task
(:func:`keylane.ops.bench.versus_dest.read_sleep_write`):

* ``celery-lock``: a pool of N processes on one queue; the task takes a per-record Redis
  lock first, the recipe people copy: ``SET lock:<key> <token> NX PX <ttl>``, released
  by a Lua compare-and-delete so it never deletes the next holder's lock. A task that
  cannot get the lock retries with a short countdown (``Task.retry``, no retry limit),
  as users do;
* ``celery-plain``: the same pool without the lock;
* ``celery-hashed``: N solo workers, each consuming one queue; the publisher routes each
  event to queue ``stable_hash(key) % N``, so one process applies a record's events.

Every task marks its delivery done in a Redis hash (``HSET done <delivery> <time>``)
after its write, which is how the benchmark knows when a run is over and when each
event was applied. Workers are started with ``python -m keylane.ops.bench.versus_celery
ARGS`` (Celery's worker arguments); their settings come from the environment
(:data:`ENV`), read by :func:`config_from_env` when the process starts.
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from ...routing import stable_hash
from .versus_dest import Table, read_sleep_write

RMW_TASK = "versus.rmw"
LOCKED_TASK = "versus.rmw_locked"
PING_TASK = "versus.ping"
POOL_QUEUE = "versus.pool"
PLAIN_QUEUE = "versus.plain"

#: Compare-and-delete: release the lock only if it still holds our token.
RELEASE_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""

ENV = {
    "broker": "KLVERSUS_BROKER_URL",
    "prefix": "KLVERSUS_PREFIX",
    "destination": "KLVERSUS_DESTINATION_URL",
    "lock_ttl_ms": "KLVERSUS_LOCK_TTL_MS",
    "retry_ms": "KLVERSUS_LOCK_RETRY_MS",
}


def hashed_queue(n: int) -> str:
    """The queue of solo worker ``n``."""
    return f"versus.hash.{n}"


def queue_for(key: str, processes: int) -> str:
    """The queue a record's events go to in ``celery-hashed``."""
    return hashed_queue(stable_hash(key) % processes)


@dataclass(frozen=True)
class CeleryConfig:
    """What the app needs: the broker, a key prefix of its own, the destination table,
    and the lock's TTL and retry countdown."""

    broker_url: str
    prefix: str  # e.g. "klbench-1a2b3c-celery:"; every Redis key of the app starts with it
    destination_url: str
    lock_ttl_ms: int
    retry_ms: int

    def env(self) -> dict[str, str]:
        """The environment a worker process reads this from."""
        values = {
            "broker": self.broker_url,
            "prefix": self.prefix,
            "destination": self.destination_url,
            "lock_ttl_ms": str(self.lock_ttl_ms),
            "retry_ms": str(self.retry_ms),
        }
        return {ENV[name]: value for name, value in values.items()}

    def done_key(self, tag: str) -> str:
        """The hash of delivery -> applied time for run ``tag``."""
        return f"{self.prefix}done:{tag}"

    def lock_retries_key(self, tag: str) -> str:
        """How many times a task of run ``tag`` found its record locked."""
        return f"{self.prefix}lock-retries:{tag}"


def config_from_env() -> CeleryConfig:
    """The worker's settings, from :data:`ENV`."""
    env = os.environ
    return CeleryConfig(
        broker_url=env[ENV["broker"]],
        prefix=env[ENV["prefix"]],
        destination_url=env[ENV["destination"]],
        lock_ttl_ms=int(env[ENV["lock_ttl_ms"]]),
        retry_ms=int(env[ENV["retry_ms"]]),
    )


class _ProcessState:
    """A worker process's connections, opened on first use (after the prefork fork)."""

    def __init__(self, config: CeleryConfig) -> None:
        self.config = config
        self.pid = 0
        self.tables: dict[str, Table] = {}
        self.redis: redis.Redis | None = None

    def connections(self, table: str) -> tuple[Table, redis.Redis]:
        if self.pid != os.getpid() or self.redis is None:
            self.pid = os.getpid()
            self.tables = {}
            self.redis = redis.Redis.from_url(self.config.broker_url, socket_timeout=10)
        if table not in self.tables:
            self.tables[table] = Table(self.config.destination_url, table)
        return self.tables[table], self.redis


def create_app(config: CeleryConfig) -> Celery:
    """The Celery app: its tasks, on the broker under ``config.prefix``."""
    app = Celery("versus", broker=config.broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": config.prefix, "socket_timeout": 10},
        broker_connection_retry_on_startup=True,
        broker_pool_limit=64,  # the 32 sender threads publish at once
        task_default_queue=POOL_QUEUE,
        task_ignore_result=True,
        worker_send_task_events=False,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
    )
    state = _ProcessState(config)

    def apply(job: dict[str, Any]) -> None:
        table, client = state.connections(job["table"])
        read_sleep_write(table, job["key"], job["seq"], job["amount"], job["latency_ms"] / 1000)
        client.hset(job["done"], str(job["delivery"]), repr(time.time()))

    def rmw(job: dict[str, Any]) -> None:
        apply(job)

    def rmw_locked(task: Any, job: dict[str, Any]) -> None:
        _table, client = state.connections(job["table"])
        lock, token = f"{config.prefix}lock:{job['key']}", uuid.uuid4().hex
        if not client.set(lock, token, nx=True, px=config.lock_ttl_ms):
            client.incr(job["retries"])
            countdown_s = config.retry_ms / 1000 * random.uniform(0.5, 1.5)
            raise task.retry(countdown=countdown_s)
        try:
            apply(job)
        finally:
            client.eval(RELEASE_LUA, 1, lock, token)

    def ping(table: str, key: str, queue: str) -> None:
        _table, client = state.connections(table)
        client.hset(key, queue, str(os.getpid()))

    app.task(name=RMW_TASK, shared=False)(rmw)
    # Unbounded retries: with Celery's default of 3, a task that keeps finding a hot
    # record locked fails, and its event is lost (``retry(max_retries=None)`` means
    # "the task's default", not "no limit").
    app.task(name=LOCKED_TASK, shared=False, bind=True, max_retries=None)(rmw_locked)
    app.task(name=PING_TASK, shared=False)(ping)
    return app


def worker_argv(*args: str) -> list[str]:
    """A Celery worker of this app, with ``args`` (queues, pool, concurrency)."""
    return [sys.executable, "-m", "keylane.ops.bench.versus_celery", *args]


def main() -> None:
    """Run a Celery worker of the app, configured from the environment."""
    app = create_app(config_from_env())
    app.worker_main(
        [
            "worker",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
            *sys.argv[1:],
        ]
    )


if __name__ == "__main__":
    main()
