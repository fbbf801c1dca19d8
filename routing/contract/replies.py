"""How both sides read Redis replies: pure parsing, whatever redis-py release returned them.

(Each side's Redis gateway maps Redis errors to :class:`~.errors.BrokerUnavailable` itself:
the contract imports no client library.)
"""

from __future__ import annotations


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
