"""What the receiver knows about the queues: depths, drain rates, oldest messages, and the
Prometheus metrics built from them and from the lanes' counters.

A :class:`QueueWatch` reads every shard's depth, head message and drain count once a
second while deliveries come (one pipelined round trip), and once every ten seconds while
none do (two commands a shard: at a trickle a poll a second cost more Redis commands than
the events). It gives the receiver a global depth for the global high-water mark, and a
drain rate per shard for ``Retry-After``: the time the shard needs to drain to half its
high-water mark at the rate it drained lately, or the ceiling when it drained nothing
lately (a sender told "1 s" would hammer a shard that does not move). A ``/metrics``
scrape reads the queues afresh when the last poll is older than a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..routing.contract.destinations import CALL_OUTCOMES
from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.message import event_of
from ..routing.redis_keys import LATENCY_BUCKETS_S
from .gateway import MetricSnapshot, ReceiverGateway

log = logging.getLogger("keylane.queue_watch")

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 120
#: Weight of the newest sample in the drain-rate average (per poll, ~1 s).
RATE_SMOOTHING = 0.3
#: A shard that acknowledged nothing for this long is not draining.
DRAINING_WITHIN_S = 5.0


@dataclass
class ShardView:
    """One shard as last seen."""

    depth: int = 0
    oldest_accepted_at: float | None = None
    drained: int = 0
    rate_per_s: float = 0.0
    drained_at: float | None = None  # when a poll last saw the drain count rise

    def draining(self, now: float) -> bool:
        """Whether the shard acknowledged anything lately."""
        return self.drained_at is not None and now - self.drained_at <= DRAINING_WITHIN_S


@dataclass
class QueueWatch:
    """Polls the shard queues (see the module docstring)."""

    gateway: ReceiverGateway
    interval_s: float = 1.0
    #: How often it polls while no delivery comes.
    idle_interval_s: float = 10.0
    views: dict[int, ShardView] = field(default_factory=dict)
    polled_at: float = 0.0
    #: Events waiting in all shard queues, as last seen (summed once per poll: every
    #: delivery reads it).
    total_depth: int = 0
    #: Whether a delivery asked for the depths since the last poll (:meth:`asked`).
    wanted: bool = False
    _stopped: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def total_rate(self) -> float:
        """Events per second drained over all shards, lately."""
        return sum(v.rate_per_s for v in self.views.values())

    def retry_after(self, shard: int, depth: int, high_water: int) -> int:
        """Seconds for ``shard``, ``depth`` deep (as the accept script just saw it), to
        drain to half its high-water mark at its recent rate; the ceiling when it did not
        drain lately."""
        view = self.views.get(shard, ShardView())
        if not view.draining(time.monotonic()):
            return MAX_RETRY_AFTER_S
        return _seconds_to_drain(max(depth, view.depth) - high_water // 2, view.rate_per_s)

    def retry_after_global(self, high_water: int) -> int:
        """Seconds for all shards together to drain to half the global high-water mark;
        the ceiling when none drained lately."""
        now = time.monotonic()
        if not any(view.draining(now) for view in self.views.values()):
            return MAX_RETRY_AFTER_S
        return _seconds_to_drain(self.total_depth - high_water // 2, self.total_rate)

    async def run(self) -> None:
        """Poll every ``interval_s`` while deliveries come, every ``idle_interval_s`` while
        none do, until :meth:`stop`."""
        while not self._stopped.is_set():
            self.wanted = False
            try:
                await self.poll()
            except BrokerUnavailable as exc:
                log.debug("queue poll failed: %s", exc)
            idle_until = time.monotonic() + self.idle_interval_s
            while not self._stopped.is_set() and time.monotonic() < idle_until:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await self._stopped.wait()
                if self.wanted:
                    break

    async def fresh(self) -> None:
        """Poll now unless the last poll is younger than ``interval_s`` (a scrape)."""
        if time.monotonic() - self.polled_at >= self.interval_s:
            await self.poll()

    def stop(self) -> None:
        """End :meth:`run` once the poll under way, if any, returns. (Not a cancel: one
        that lands inside a Redis call can come out of it as a Redis error, a failed poll
        like any other, and the loop polled on: a receiver hung on SIGTERM, 6 times in
        25 stops.)"""
        self._stopped.set()

    async def poll(self) -> None:
        """Read every shard once."""
        snapshot = await self.gateway.reads.queues()
        now = time.monotonic()
        elapsed = now - self.polled_at if self.polled_at else 0.0
        drained = snapshot.drained
        for shard, depth in enumerate(snapshot.depths):
            view = self.views.setdefault(shard, ShardView(drained=drained.get(shard, 0)))
            view.depth = depth
            view.oldest_accepted_at = _accepted_at(snapshot.heads[shard])
            count = drained.get(shard, 0)
            if elapsed > 0:
                rate = max(0, count - view.drained) / elapsed
                view.rate_per_s += RATE_SMOOTHING * (rate - view.rate_per_s)
                if count > view.drained:
                    view.drained_at = now
            view.drained = count
        self.total_depth = sum(snapshot.depths)
        self.polled_at = now


def _seconds_to_drain(excess: int, rate_per_s: float) -> int:
    if rate_per_s <= 0.01:  # not draining at all (destination down): ask for a long wait
        return MAX_RETRY_AFTER_S
    if excess <= 0:
        return MIN_RETRY_AFTER_S
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(excess / rate_per_s)))


def _accepted_at(raw: bytes | None) -> float | None:
    event = event_of(raw)
    value = None if event is None else event.get("accepted_at")
    return float(value) if isinstance(value, int | float) else None


# -- Prometheus --------------------------------------------------------------------------

#: Counters the accept script and the lanes keep in Redis: (key, metric, help).
REDIS_COUNTERS = (
    ("accepted", "keylane_accepted_total", "Events accepted (answered 202)."),
    (
        "duplicate_deliveries",
        "keylane_duplicate_deliveries_total",
        "Deliveries answered 200 as duplicates of an accepted event.",
    ),
    ("keyless", "keylane_keyless_total", "Accepted events whose sender gave no event id."),
    ("applied", "keylane_applied_total", "Events applied to their record."),
    (
        "duplicate",
        "keylane_lane_duplicates_total",
        "Deliveries the lanes found already applied (journal).",
    ),
    ("dead_lettered", "keylane_dead_letters_total", "Events that became dead-letter rows."),
    (
        "refused",
        "keylane_refusals_total",
        "Events refused: a condition on the record unmet, or a task's keylane.Refuse.",
    ),
    ("conflicts", "keylane_conflicts_total", "Conditional writes refused (revision moved)."),
    ("attempts", "keylane_attempts_total", "Write attempts of events that finished."),
    ("parked", "keylane_parked_total", "Events parked behind an open dead letter."),
    ("merged", "keylane_merges_total", "Merges applied: a record closed into its survivor."),
    (
        "merge_reviews",
        "keylane_merge_reviews_total",
        "Merges not applied because fields differ: review rows for a person.",
    ),
    (
        "merges_kept_apart",
        "keylane_merges_kept_apart_total",
        "Merges proposed again for a pair a person kept apart, and not applied.",
    ),
    (
        "merges_undone",
        "keylane_merges_undone_total",
        "Merges undone by a person: a record reopened beside its survivor.",
    ),
    (
        "forwarded",
        "keylane_forwarded_total",
        "Events of a merged record sent on to the record that absorbed it.",
    ),
)


#: The tables the prune reports the size of (see ``ops/retention.py``).
RETAINED_TABLES = ("journal", "dead_letters", "archived_ids", "lease_log")
#: The last prune: (field in the retention hash, metric, help).
PRUNE_GAUGES = (
    ("last_prune_at", "keylane_prune_last_run_timestamp_seconds", "When the last prune ended."),
    ("last_prune_seconds", "keylane_prune_last_run_duration_seconds", "How long it ran."),
    (
        "last_prune_longest_batch_seconds",
        "keylane_prune_longest_batch_seconds",
        "Its longest delete transaction: the most a lane waited on it.",
    ),
)


class ReceiverMetrics:
    """The receiver's own counters (refusals), and a collector for everything else."""

    def __init__(self, watch: QueueWatch, gateway: ReceiverGateway) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.refused = RefusalCounts()
        self._snapshot = _Snapshot(watch, gateway, self.refused)
        self.registry.register(self._snapshot)

    async def render(self) -> bytes:
        """The exposition text, with fresh values from Redis."""
        await self._snapshot.refresh()
        return generate_latest(self.registry)


@dataclass
class _Refusal:
    counts: dict[str, float]
    reason: str

    def inc(self, amount: float = 1.0) -> None:
        self.counts[self.reason] = self.counts.get(self.reason, 0.0) + amount


@dataclass
class RefusalCounts:
    """Deliveries this receiver process refused, by reason (``labels(reason).inc()``, as
    with a prometheus_client ``Counter``), exported as ``keylane_refused_total`` alone:
    a ``Counter`` would add a ``keylane_refused_created`` series of its own."""

    counts: dict[str, float] = field(default_factory=dict)

    def labels(self, reason: str) -> _Refusal:
        """The count of ``reason``."""
        return _Refusal(self.counts, reason)


class _Snapshot(Collector):
    """Metric families from Redis counters and the queue watch, read at scrape time."""

    def __init__(self, watch: QueueWatch, gateway: ReceiverGateway, refused: RefusalCounts) -> None:
        self.watch = watch
        self.gateway = gateway
        self.refused = refused
        self.snapshot = MetricSnapshot({}, {}, 0, 0)

    async def refresh(self) -> None:
        await self.watch.fresh()
        self.snapshot = await self.gateway.reads.metrics()

    def collect(self) -> Iterable[Any]:
        refused = CounterMetricFamily(
            "keylane_refused",
            "Deliveries refused, by reason (the error code answered).",
            labels=["reason"],
        )
        for reason, count in sorted(self.refused.counts.items()):
            refused.add_metric([reason], count)
        yield refused
        for key, name, doc in REDIS_COUNTERS:
            family = CounterMetricFamily(name.removesuffix("_total"), doc)
            family.add_metric([], self.snapshot.counters.get(key, 0.0))
            yield family
        full = CounterMetricFamily(
            "keylane_shard_full_refusals",
            "Deliveries refused with 503 because their shard was at its high-water mark.",
        )
        full.add_metric([], self.snapshot.counters.get("refused_full", 0.0))
        yield full
        yield self._latency()
        yield from self._queues()
        workers = GaugeMetricFamily("keylane_workers", "Live worker processes.")
        workers.add_metric([], self.snapshot.members)
        yield workers
        held = GaugeMetricFamily("keylane_held_keys", "Record keys held behind a dead letter.")
        held.add_metric([], self.snapshot.held)
        yield held
        yield from self._destinations()
        yield from self._schedules()
        yield from self._retention()

    def _schedules(self) -> Iterable[Any]:
        ticks = CounterMetricFamily(
            "keylane_schedule_ticks",
            "Ticks of each scheduled job by what became of them: started (at its time), "
            "buffered (after the previous run), skipped (a run was going), missed (no "
            "scheduler ran it at its time).",
            labels=["job", "outcome"],
        )
        runs = CounterMetricFamily(
            "keylane_schedule_runs",
            "Runs of each scheduled job by outcome: ok, failed, interrupted (its scheduler "
            "died or paused past the lease), rerun (an interrupted run started again).",
            labels=["job", "outcome"],
        )
        running = GaugeMetricFamily(
            "keylane_schedule_running_seconds",
            "How long the job's run in progress has run (0: none runs).",
            labels=["job"],
        )
        success = GaugeMetricFamily(
            "keylane_schedule_last_success_timestamp_seconds",
            "Scheduled time of the job's last run that ended without error.",
            labels=["job"],
        )
        for state in self.snapshot.schedules:
            for outcome, count in state.ticks.items():
                ticks.add_metric([state.job, outcome], count)
            for outcome, count in state.runs.items():
                runs.add_metric([state.job, outcome], count)
            running.add_metric([state.job], state.running_for_s or 0.0)
            if state.last_success is not None:
                success.add_metric([state.job], state.last_success / 1000)
        return [ticks, runs, running, success]

    def _retention(self) -> Iterable[Any]:
        """The store's tables and the last prune, as the prune recorded them (the
        receiver never reads the store): they are as fresh as the last prune."""
        figures = self.snapshot.retention
        label = ["table"]
        rows = GaugeMetricFamily(
            "keylane_store_rows",
            "Rows in the store's tables (journal, closed dead letters, archived ids) and "
            "entries in the lease log, at the last prune.",
            labels=label,
        )
        oldest = GaugeMetricFamily(
            "keylane_store_oldest_row_timestamp_seconds",
            "When the oldest row of each table was written, at the last prune.",
            labels=label,
        )
        archived = CounterMetricFamily(
            "keylane_archived_rows", "Rows moved to the archive by the prune.", labels=label
        )
        for table in RETAINED_TABLES:
            if f"{table}_rows" in figures:
                rows.add_metric([table], figures[f"{table}_rows"])
            if f"{table}_oldest" in figures:
                oldest.add_metric([table], figures[f"{table}_oldest"])
            if table != "archived_ids":
                archived.add_metric([table], figures.get(f"archived_{table}", 0.0))
        families = [rows, oldest, archived]
        for key, name, doc in PRUNE_GAUGES:
            if key in figures:
                family = GaugeMetricFamily(name, doc)
                family.add_metric([], figures[key])
                families.append(family)
        return families

    def _destinations(self) -> Iterable[Any]:
        label = ["destination"]
        in_flight = GaugeMetricFamily(
            "keylane_destination_in_flight", "Calls in flight, over every worker.", labels=label
        )
        limit = GaugeMetricFamily(
            "keylane_destination_rate_limit",
            "Calls per second configured (0: none).",
            labels=label,
        )
        rate_now = GaugeMetricFamily(
            "keylane_destination_rate",
            "Calls per second allowed now: the configured rate, or lower after a 429 (0: none).",
            labels=label,
        )
        next_token = GaugeMetricFamily(
            "keylane_destination_next_token_seconds",
            "Seconds until the next call may start (rate or Retry-After).",
            labels=label,
        )
        calls = CounterMetricFamily(
            "keylane_destination_calls",
            "Calls that ended, by outcome (" + ", ".join(CALL_OUTCOMES) + "); their sum is "
            "every call made but those in flight.",
            labels=["destination", "outcome"],
        )
        waits = CounterMetricFamily(
            "keylane_destination_waits",
            "Times a call had to wait (in-flight limit, rate, Retry-After).",
            labels=label,
        )
        cuts = CounterMetricFamily(
            "keylane_destination_rate_cuts",
            "Times the destination's rate was lowered after a 429.",
            labels=label,
        )
        for state in self.snapshot.destinations:
            in_flight.add_metric([state.name], state.in_flight)
            limit.add_metric([state.name], state.rate_per_s or 0)
            rate_now.add_metric([state.name], state.rate_now or 0)
            next_token.add_metric([state.name], state.next_token_s)
            for outcome in CALL_OUTCOMES:
                calls.add_metric([state.name, outcome], state.counters.get(outcome, 0))
            waits.add_metric([state.name], state.counters.get("waits", 0))
            cuts.add_metric([state.name], state.counters.get("rate_cuts", 0))
        return [in_flight, limit, rate_now, next_token, calls, waits, cuts]

    def _latency(self) -> HistogramMetricFamily:
        cumulative, buckets = 0.0, []
        for bound in LATENCY_BUCKETS_S:
            cumulative += self.snapshot.latency.get(repr(bound), 0.0)
            buckets.append((repr(bound), cumulative))
        buckets.append(("+Inf", cumulative + self.snapshot.latency.get("+Inf", 0.0)))
        return HistogramMetricFamily(
            "keylane_apply_latency_seconds",
            "Time from acceptance (202) to the committed write, for applied events.",
            buckets=buckets,
            sum_value=self.snapshot.latency.get("sum", 0.0),
        )

    def _queues(self) -> Iterable[GaugeMetricFamily]:
        now = time.time()
        depth = GaugeMetricFamily(
            "keylane_queue_depth", "Events waiting, per shard.", labels=["shard"]
        )
        age = GaugeMetricFamily(
            "keylane_oldest_message_age_seconds",
            "Age of the event at the head of the shard queue.",
            labels=["shard"],
        )
        rate = GaugeMetricFamily(
            "keylane_drain_rate", "Events per second drained lately.", labels=["shard"]
        )
        for shard, view in sorted(self.watch.views.items()):
            label = [str(shard)]
            depth.add_metric(label, view.depth)
            age.add_metric(
                label,
                0.0 if view.oldest_accepted_at is None else max(0.0, now - view.oldest_accepted_at),
            )
            rate.add_metric(label, view.rate_per_s)
        return [depth, age, rate]
