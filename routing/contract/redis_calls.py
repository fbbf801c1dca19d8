"""How both sides read Redis replies and report Redis failures.

Every gateway (:mod:`keylane.producers.gateway`, :mod:`keylane.workers.gateway`,
:mod:`keylane.ops.telemetry`) runs its Redis calls inside :func:`broker_errors`, so a
connection problem reaches the rest of keylane as one error, :class:`BrokerUnavailable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from redis.exceptions import RedisError

from .errors import BrokerUnavailable


@contextlib.contextmanager
def broker_errors() -> Iterator[None]:
    """Turn any Redis error raised inside the block (sync or ``await``-ed) into
    :class:`BrokerUnavailable`."""
    try:
        yield
    except RedisError as exc:
        raise BrokerUnavailable(f"Redis: {exc}") from exc


def run_script(script: Any, keys: list[str], args: list[Any]) -> Any:
    """Run a registered Lua script (sync), Redis errors as :class:`BrokerUnavailable`."""
    with broker_errors():
        return script(keys=keys, args=args)


def reply_int(value: object) -> int:
    """A Redis integer reply (or a number sent as text) as an ``int``; ``0`` for nil.

    Typed on ``object`` so callers need no ``type: ignore`` for the reply types, which
    change between redis-py releases (a union with ``Awaitable`` before 8.x)."""
    if value is None:
        return 0
    if isinstance(value, int | float | str | bytes):
        return int(value)
    raise TypeError(f"not an integer reply: {value!r}")


def reply_text(value: object) -> str:
    """A Redis reply as text (``""`` for nil)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)
