"""The receiver's metrics (Prometheus text, served on the operations listener): its own
refusals, and everything else read fresh from Redis at each scrape: the counters the accept
script and the lanes keep, the latency histogram, each shard's depth, oldest event and
drain rate (from the :class:`~keylane.producers.queue_watch.QueueWatch`), live workers,
held keys, each source's backlog, flow control, schedules and the last prune."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ..routing.contract.destinations import CALL_OUTCOMES
from ..routing.redis_keys import LATENCY_BUCKETS_S
from .gateway import MetricSnapshot, ReceiverGateway
from .queue_watch import QueueWatch

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
        backlog = GaugeMetricFamily(
            "keylane_source_backlog",
            "Events of a source accepted and not finished (fair admission weighs these).",
            labels=["source"],
        )
        for source, waiting in sorted(self.snapshot.backlog.items()):
            backlog.add_metric([source], waiting)
        yield backlog
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
