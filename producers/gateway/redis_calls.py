"""How the producers' gateways run Redis: Lua scripts by their SHA1 (``scripts/`` beside
this module, each loaded by name), and Redis errors as :class:`BrokerUnavailable`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, cast

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from ...routing.contract.redis_scripts import ScriptFolder, errors_as_unavailable


class LoadedScript(AsyncScript):
    """A Lua script called by its SHA1: redis-py's own (``EVALSHA``; on ``NOSCRIPT``, a
    restarted or flushed Redis, ``SCRIPT LOAD`` and again), so the body crosses the wire
    only when Redis does not have it yet. Built from its text alone; :func:`run_script`
    runs it on a gateway's client."""

    def __init__(self, source: str) -> None:
        # From bytes, redis-py needs no client to take the SHA (UTF-8, as its encoder).
        super().__init__(cast(Any, None), source.encode())


async def run_script(
    client: aioredis.Redis, script: LoadedScript, keys: list[str], args: list[Any]
) -> Any:
    """Run ``script`` on ``client`` (see :class:`LoadedScript`), Redis errors as
    :class:`BrokerUnavailable`."""
    with broker_errors():
        return await script(keys=keys, args=args, client=client)


def as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def broker_errors() -> AbstractContextManager[None]:
    """Turn any Redis error raised inside the block (sync or ``await``-ed) into
    :class:`BrokerUnavailable`: the receiver answers 503 for a Redis outage (the one
    mapping, :func:`~keylane.routing.contract.redis_scripts.errors_as_unavailable`)."""
    return errors_as_unavailable(RedisError)


#: The receiver's and the scheduler's scripts, ``scripts/<name>.lua`` beside the gateway.
SCRIPTS = ScriptFolder(__package__, "scripts")


def script_text(name: str) -> str:
    """The Lua source of script ``name``: ``scripts/<name>.lua`` beside the gateway, the
    key layout it uses written at its top."""
    return SCRIPTS.source(name)
