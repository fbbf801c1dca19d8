"""Reading flow control and the scheduled jobs' state from Redis, the same way for the
receiver's ``/metrics`` (asyncio client, :mod:`.gateway`) and for ``keylane status`` and
``keylane schedules`` (sync client, ``ops``' deployment view): each side queues these reads
on a pipeline of its own and parses the replies here. What a destination's bucket or a
job's hash means is the contract's (:meth:`FlowState.of
<keylane.routing.contract.destinations.FlowState.of>`, :meth:`ScheduleState.of
<keylane.routing.contract.schedule_state.ScheduleState.of>`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..routing.contract.destinations import FlowState
from ..routing.contract.replies import reply_text
from ..routing.contract.schedule_state import ScheduleState
from ..routing.redis_keys import RedisKeys


def queue_flow_reads(pipe: Any, keys: RedisKeys, names: list[str]) -> None:
    """Queue on a Redis pipeline (sync or asyncio) the reads :func:`flow_states` needs."""
    pipe.time()
    for name in names:
        pipe.hgetall(keys.flow_bucket(name))
        pipe.zcard(keys.flow_calls(name))
        pipe.hgetall(keys.flow_counters(name))


def flow_states(replies: list[Any], names: list[str]) -> list[FlowState]:
    """The destinations' flow states from the replies of :func:`queue_flow_reads`."""
    now_ms = _now_ms(replies[0])
    return [
        FlowState.of(name, _texts(bucket), int(in_flight), _counts(counters), now_ms)
        for name, (bucket, in_flight, counters) in _by_name(replies, names, 3)
    ]


def queue_schedule_reads(pipe: Any, keys: RedisKeys, names: list[str]) -> None:
    """Queue on a Redis pipeline (sync or asyncio) what :func:`schedule_states` needs,
    for the jobs ``names`` (the members of ``keys.schedules``)."""
    pipe.time()
    for name in names:
        pipe.hgetall(keys.schedule(name))
        pipe.get(keys.schedule_lease(name))


def schedule_states(replies: list[Any], names: list[str]) -> list[ScheduleState]:
    """The jobs' states from the replies of :func:`queue_schedule_reads`."""
    now_ms = _now_ms(replies[0])
    return [
        ScheduleState.of(name, _texts(raw), reply_text(lease) or None, now_ms)
        for name, (raw, lease) in _by_name(replies, names, 2)
    ]


def _now_ms(time_reply: Any) -> int:
    """Redis's clock, a ``TIME`` reply (seconds, microseconds), in milliseconds."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def _by_name(replies: list[Any], names: list[str], width: int) -> Iterator[tuple[str, list[Any]]]:
    """Each name with its ``width`` replies, in the order they were queued after ``TIME``."""
    for i, name in enumerate(names):
        yield name, replies[1 + width * i : 1 + width * (i + 1)]


def _counts(hash_reply: Any) -> dict[str, int]:
    return {reply_text(k): int(v) for k, v in hash_reply.items()}


def _texts(hash_reply: Any) -> dict[str, str]:
    return {reply_text(k): reply_text(v) for k, v in hash_reply.items()}
