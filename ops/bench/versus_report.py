"""The versus benchmark's output: one table per workload and latency, then one JSON line."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..tables import render_table
from .versus_systems import Case, SystemRun

HEADERS = (
    "system",
    "applied/s",
    "p50 ms",
    "p99 ms",
    "lost units",
    "reordered",
    "double",
    "elapsed s",
    "x cp bound",
    "x best bound",
    "cpu ms/ev",
    "worker ms/ev",
    "notes",
)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def bounds(case: Case, processes: int) -> tuple[float, float]:
    """The critical-path bound, and the larger of it and the slots bound, in seconds."""
    cp = case.work.critical_path_s(case.latency_s)
    return cp, max(cp, case.work.slots_bound_s(case.latency_s, processes))


def render_case(case: Case, runs: Sequence[SystemRun], processes: int) -> str:
    """The table of one case, with its bounds above it."""
    work = case.work
    cp, best = bounds(case, processes)
    copies = len(work.deliveries) // work.events
    sends = f", each delivered {copies} times" if copies > 1 else ""
    head = [
        f"== {work.name}: {work.events} events over {work.records} records{sends}; "
        f"destination latency {case.latency_ms} ms; {processes} processes each",
        f"   critical-path bound {cp:.2f} s (hottest record: {work.hottest} events x "
        f"{case.latency_ms} ms = {work.events / cp:.0f} ev/s); slots bound "
        f"{work.slots_bound_s(case.latency_s, processes):.2f} s "
        f"({work.events} x {case.latency_ms} ms / {processes})",
    ]
    rows = [_row(run, cp, best) for run in runs]
    return "\n".join([*head, render_table(HEADERS, rows)])


def _row(run: SystemRun, cp: float, best: float) -> list[object]:
    lat = run.latencies_ms()
    elapsed = run.elapsed_s
    per_s = run.applied_per_s
    fx = run.effects
    notes = [f"{k} {v}" for k, v in run.extra.items() if v]
    if run.applied < run.case.work.events:
        notes.append(f"INCOMPLETE: {run.applied}/{run.case.work.events} applied")
    if fx.torn_records:
        notes.append(f"{fx.torn_records} torn records")
    if run.sent.failures:
        notes.append(f"{len(run.sent.failures)} senders failed")
    if run.sent.retries:
        notes.append(f"sender retries {run.sent.retries}")
    notes += fx.problems[:1]
    return [
        run.system,
        None if per_s is None else f"{per_s:.0f}",
        f"{percentile(lat, 50):.0f}",
        f"{percentile(lat, 99):.0f}",
        f"{fx.lost_units} ({fx.lost_events} ev)" if fx.lost_events else "0",
        fx.reordered,
        fx.double,
        None if elapsed is None else f"{elapsed:.2f}",
        None if elapsed is None else f"{elapsed / cp:.2f}",
        None if elapsed is None else f"{elapsed / best:.2f}",
        f"{run.cpu_s / run.case.work.events * 1000:.1f}",
        _per_event_ms(run.worker_cpu_s, run),
        "; ".join(notes),
    ]


def _per_event_ms(cpu_s: float | None, run: SystemRun) -> str | None:
    return None if cpu_s is None else f"{cpu_s / run.case.work.events * 1000:.2f}"


def as_json(run: SystemRun, processes: int) -> dict[str, Any]:
    """One run's numbers."""
    cp, best = bounds(run.case, processes)
    lat = run.latencies_ms()
    elapsed = run.elapsed_s
    fx = run.effects
    return {
        "workload": run.case.work.name,
        "latency_ms": run.case.latency_ms,
        "events": run.case.work.events,
        "system": run.system,
        "applied": run.applied,
        "applied_per_s": None if run.applied_per_s is None else round(run.applied_per_s, 1),
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "lost_units": fx.lost_units,
        "lost_events": fx.lost_events,
        "reordered": fx.reordered,
        "double": fx.double,
        "torn_records": fx.torn_records,
        "elapsed_s": None if elapsed is None else round(elapsed, 3),
        "critical_path_s": round(cp, 3),
        "best_bound_s": round(best, 3),
        "cpu_ms_per_event": round(run.cpu_s / run.case.work.events * 1000, 2),
        "worker_cpu_ms_per_event": None
        if run.worker_cpu_s is None
        else round(run.worker_cpu_s / run.case.work.events * 1000, 2),
        "idle_others_cpu_s": round(run.others_cpu_s, 2),
        "sender_retries": run.sent.retries,
        "sender_failures": len(run.sent.failures),
        **{k.replace(" ", "_"): v for k, v in run.extra.items()},
    }


def json_line(runs: Sequence[SystemRun], processes: int, options: dict[str, Any]) -> str:
    """Everything, on one line."""
    return json.dumps(
        {"versus": {"options": options, "runs": [as_json(r, processes) for r in runs]}}
    )
