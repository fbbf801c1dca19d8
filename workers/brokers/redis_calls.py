"""How the Redis lane broker calls Redis: its Lua scripts (``redis/*.lua`` beside this
module, loaded by name), Redis errors as :class:`BrokerUnavailable`, and the state every
part of the broker shares (the client, the key layout, the shard map, the loaded scripts)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import redis
from redis.commands.core import Script

from ...routing import ShardMap
from ...routing.contract.redis_scripts import ScriptFolder, errors_as_unavailable
from ...routing.redis_keys import RedisKeys

#: The lane scripts, ``redis/<name>.lua`` beside this module.
SCRIPTS = ScriptFolder(__package__, "redis")


def broker_errors() -> AbstractContextManager[None]:
    """Turn any Redis error raised inside the block into :class:`BrokerUnavailable` (the
    one mapping, :func:`~keylane.routing.contract.redis_scripts.errors_as_unavailable`)."""
    return errors_as_unavailable(redis.RedisError)


def run_script(script: Any, keys: list[str], args: list[Any]) -> Any:
    """Run a registered Lua script (EVALSHA, loaded again after NOSCRIPT), Redis errors as
    :class:`BrokerUnavailable`."""
    with broker_errors():
        return script(keys=keys, args=args)


def script_text(name: str) -> str:
    """The Lua source of script ``name`` (``redis/<name>.lua``), with the helpers and the
    generated layouts it includes before it."""
    return SCRIPTS.source(name)


def call(fn: Callable[[], Any]) -> Any:
    """``fn()``, a Redis error raised in it as :class:`BrokerUnavailable`."""
    with broker_errors():
        return fn()


class RedisScripts:
    """What every part of the Redis lane broker shares: the client (redis-py's
    thread-safe connection pool), the key layout, the shard map, and the scripts loaded."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, shards: ShardMap) -> None:
        self.client = client
        self.keys = keys
        self.shards = shards
        self._scripts: dict[str, Script] = {}

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.client.register_script(script_text(name))
        return run_script(script, keys, args)
