"""The operator's side of a deployment on RabbitMQ: :class:`RabbitDeploymentView` answers
what :class:`DeploymentView` answers for ``keylane status`` and ``check``, reading the
lanes where they live on RabbitMQ:

* owners, from the members' beats: the shards each live worker consumes, each with the
  fencing token it claimed (0 until a first delivery made it the active consumer: an idle
  shard's owner shows token 0), the deliveries it has not acknowledged and its records in
  a lane (a shard two beats name, during a handoff, goes to the newer token);
* the store's ``shard_fences`` for each shard's newest token, and its ``parked`` table for
  the records that wait (parked: they waited longer than a delivery may be held);
* each shard queue's ready messages by a passive declare (depth = ready + unacknowledged).

Counters, destinations and scheduled jobs stay in the Redis helper, read as on Redis.
RabbitMQ keeps no lease log: ownership is the broker's single active consumer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..routing.contract.errors import StoreMissing
from ..routing.contract.settings import Settings
from ..workers.brokers.rabbitmq import Survey, survey
from ..workers.store_rows import Parked
from ..workers.stores.sql import SqlStore
from .deployment_view import DeploymentView, head_event

T = TypeVar("T")


def unacked(lead: dict[str, int]) -> int:
    """The deliveries a beat says its worker holds unacknowledged for a shard (workers
    before the hold policy's cleanup named them ``held``: read too, for a rolling upgrade)."""
    return lead.get("unacked", lead.get("held", 0))


class RabbitDeploymentView(DeploymentView):
    """Snapshots of one namespace's lanes on RabbitMQ (one survey per view)."""

    keeps_lease_log = False  # the broker's single active consumer owns each shard

    def __init__(
        self, settings: Settings, helper: DeploymentView, store_factory: Callable[[], SqlStore]
    ) -> None:
        super().__init__(helper.client, helper.keys, helper.shards)
        self.settings = settings
        self._store_factory = store_factory
        self._survey: Survey | None = None

    def surveyed(self) -> Survey:
        """The queues and the members' beats (read once, on first use)."""
        if self._survey is None:
            self._survey = survey(self.settings)
        return self._survey

    def leads(self) -> dict[int, tuple[str, dict[str, int]]]:
        """Each led shard: the worker whose beat names it, and what the beat says of it."""
        found: dict[int, tuple[str, dict[str, int]]] = {}
        for worker, (beat, _heard) in sorted(self.surveyed().beats.items()):
            for shard, lead in beat.shards.items():
                if shard not in found or lead["token"] > found[shard][1]["token"]:
                    found[shard] = (worker, lead)
        return found

    def lease_values(self) -> dict[int, str]:
        """The owner (``worker/token``) of every led shard, by shard."""
        return {s: f"{worker}/{lead['token']}" for s, (worker, lead) in self.leads().items()}

    def depth(self, shard: int) -> int:
        """Ready messages of the shard's queue, and those its owner has not acknowledged."""
        queued = self.surveyed().queues[shard].messages or 0
        return queued + unacked(self.leads().get(shard, ("", {}))[1])

    def shard_states(self) -> list[dict[str, Any]]:
        """Per shard: owner and its token, the store's newest token, depth (ready and
        unacknowledged), records in a lane and parked, consumers of the queue."""
        leads = self.leads()
        count = self.shards.count
        stored: dict[int, int] = self._from_store(lambda s: s.fences(), {})
        fences = [stored.get(n, 0) for n in range(count)]
        parked: list[set[str]] = self._from_store(
            lambda s: [{p.record_key for p in s.parked(n)} for n in range(count)],
            [set()] * count,
        )
        out = []
        for shard, queue in enumerate(self.surveyed().queues):
            worker, lead = leads.get(shard, ("", {}))
            out.append(
                {
                    "shard": shard,
                    "queue": queue.name,
                    "holder": f"{worker}/{lead['token']}" if worker else None,
                    "lease_ttl_ms": None,
                    "fence": fences[shard],
                    "depth": (queue.messages or 0) + unacked(lead),
                    "in_flight": lead.get("busy", 0),
                    "waiting": len(parked[shard]),
                    "head": None,
                    "consumers": queue.consumers,
                }
            )
        return out

    def records(self, shards: list[int]) -> list[dict[str, Any]]:
        """The parked and held records of ``shards`` (records in a lane live in their worker's
        memory: counted per shard, not listed)."""
        now = time.time()
        rows: dict[int, tuple[list[Parked], dict[str, int]]] = self._from_store(
            lambda s: {shard: (s.parked(shard), s.held(shard)) for shard in shards}, {}
        )
        found: list[dict[str, Any]] = []
        for shard, (parked, held) in rows.items():
            by_record: dict[str, list[Any]] = {key: [] for key in held}
            for row in parked:
                by_record.setdefault(row.record_key, []).append(row)
            for key, messages in by_record.items():
                record: dict[str, Any] = {"shard": shard, "record_key": key}
                if key in held:  # behind its dead letter: its messages wait, not due
                    head = messages[0].raw if messages else None
                    record.update(state="held", dead_letter=held[key], **head_event(head))
                    record["behind"] = max(0, len(messages) - 1)
                else:
                    first = messages[0]
                    record.update(
                        state="parked",
                        reason="parked",
                        attempts=first.deliveries,
                        due_in_s=round(max(0.0, first.due_at - now), 3),
                        behind=len(messages) - 1,
                        **head_event(first.raw),
                    )
                found.append(record)
        return found

    def members(self) -> list[dict[str, Any]]:
        """The workers heard during the survey, with the time of their last beat."""
        return [
            {"worker": worker, "heartbeat_ms": int(heard * 1000), "info": beat.info}
            for worker, (beat, heard) in sorted(self.surveyed().beats.items())
        ]

    def _from_store(self, read: Callable[[SqlStore], T], default: T) -> T:
        """``read`` on a store connection opened for it (its fences, its parked and held
        records); ``default`` while it has no tables yet (no worker has started on it)."""
        try:
            store = self._store_factory()
        except StoreMissing:
            return default
        try:
            return read(store)
        finally:
            store.close()

    def lease_events(self) -> list[dict[str, str]]:
        """None: RabbitMQ keeps no lease log (the broker's single active consumer owns)."""
        return []

    def admitted_counts(self) -> dict[int, tuple[int, int]]:
        """None: RabbitMQ keeps no depth count beside its queues."""
        return {}
