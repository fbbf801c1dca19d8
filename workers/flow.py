"""Flow control of destinations, shared by every worker: at most N calls in flight and R
calls per second per destination, a pause after a ``Retry-After``, and a rate that adapts
to what the destination admits (lowered after a 429, raised slowly while calls succeed) —
all kept in Redis by two Lua scripts (``flow_acquire.lua`` and ``flow_release.lua`` beside
the lanes' Redis broker), on Redis's clock. Part of that broker (``RedisLaneBroker.flow``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..routing.contract.replies import reply_text
from ..routing.redis_keys import RedisKeys


class DestinationFlow:
    """Typed access to the flow scripts, on the lane broker's connection pool."""

    def __init__(self, keys: RedisKeys, run: Callable[[str, list[str], list[Any]], Any]) -> None:
        self.keys = keys
        #: The broker's: runs one of its scripts by name (Redis errors as BrokerUnavailable).
        self._run = run

    def acquire(
        self,
        destination: str,
        slot: str,
        max_in_flight: int | None,
        rate_per_s: float | None,
        slot_ttl_ms: int,
        adaptive: bool = True,
    ) -> tuple[float, str]:
        """Ask to start a call to ``destination`` (every worker shares its limits):
        ``(0, "ok")`` holds ``slot`` until :meth:`release`, else the seconds to wait and
        why (``paused``, ``in_flight``, ``rate``). ``rate_per_s`` is the configured rate;
        the adapted one applies when lower."""
        k = self.keys
        ok, wait_ms, why = self._run(
            "flow_acquire",
            [
                k.flow_calls(destination),
                k.flow_bucket(destination),
                k.flow_counters(destination),
                k.destinations,
            ],
            [
                slot,
                max_in_flight or 0,
                rate_per_s or 0,
                slot_ttl_ms,
                destination,
                int(adaptive),
            ],
        )
        return (0.0 if ok else int(wait_ms) / 1000), reply_text(why)

    def release(
        self,
        destination: str,
        slot: str,
        outcome: str,
        pause_s: float = 0,
        throttled: bool = False,
        slot_ttl_ms: int = 0,
        adaptive: bool = True,
    ) -> float | None:
        """The call in ``slot`` (held for ``slot_ttl_ms``) ended with ``outcome``
        (counted); ``pause_s`` pauses the destination for every worker (a
        ``Retry-After``); ``throttled`` (a 429) lowers its rate when it adapts, and a
        ``done`` raises it slowly. The new rate (calls/s) when this call cut it."""
        k = self.keys
        cut = self._run(
            "flow_release",
            [
                k.flow_calls(destination),
                k.flow_bucket(destination),
                k.flow_counters(destination),
                k.flow_admitted(destination),
            ],
            [slot, outcome, int(pause_s * 1000), int(throttled), slot_ttl_ms, int(adaptive)],
        )
        text = reply_text(cut)
        return float(text) if text else None
