"""Which wire version a producer writes (:mod:`keylane.routing.contract.wire`): the newest
every live worker reads, as their membership beats say, so that during a rolling upgrade
(workers first, producers after) no worker meets a message it cannot read.

Read again at most every :data:`REFRESH_S` (one round trip: the live members and their
info), on the accept path itself: no task of its own, and a producer that accepts nothing
reads nothing. Until the first read has answered, a producer writes nothing newer than
version 1, which every release reads.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.wire import WIRE_VERSION, wire_of_member
from .gateway import ReceiverGateway

log = logging.getLogger("keylane.receiver")

#: How stale the producer's view of the workers' versions may be.
REFRESH_S = 2.0


class WireChoice:
    """The wire version this process writes, from the members of ``gateway``'s deployment
    that beat within ``member_ttl_ms``."""

    def __init__(self, gateway: ReceiverGateway, member_ttl_ms: int) -> None:
        self.gateway = gateway
        self.member_ttl_ms = member_ttl_ms
        self.version = 1
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    async def current(self) -> int:
        """The version to write now. The first call waits for the members' versions;
        later ones take the last read and start another when it is old."""
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < REFRESH_S:
            return self.version
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read())
        if self._read_at is None:
            await asyncio.shield(self._reading)
        return self.version

    async def _read(self) -> None:
        try:
            infos = await self.gateway.reads.member_infos(self.member_ttl_ms)
        except BrokerUnavailable as exc:  # the accept meets the same error and answers 503
            log.debug("cannot read the workers' wire versions: %s", exc)
            return
        # No live worker: none to keep to (the documented order upgrades workers first,
        # so no worker of an older release joins later).
        version = min([wire_of_member(info) for info in infos], default=WIRE_VERSION)
        if version != self.version and self._read_at is not None:
            log.info("writing wire version %s (the oldest live worker reads it)", version)
        self.version = min(version, WIRE_VERSION)
        self._read_at = time.monotonic()


class WireVersionGauge(Collector):
    """``keylane_wire_version``: the wire version this receiver writes now (the newest
    every live worker reads), for an operator following a rolling upgrade."""

    def __init__(self, choice: WireChoice) -> None:
        self.choice = choice

    def collect(self) -> list[GaugeMetricFamily]:
        """The one gauge."""
        gauge = GaugeMetricFamily(
            "keylane_wire_version",
            "The wire version of the messages this receiver writes (routing/contract/wire.py).",
        )
        gauge.add_metric([], self.choice.version)
        return [gauge]
