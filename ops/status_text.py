"""``keylane status`` as text: what needs a look first, then the rest in summary.

The report of :func:`keylane.ops.status.collect_status` is rendered section by section;
each section is a function of the report returning its lines (none when it has nothing to
say), and :data:`SECTIONS` is their order. A new view of the deployment is one more
function in that list.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from ..routing.contract.destinations import CALL_OUTCOMES
from ..routing.shards import shard_ranges
from .tables import LABELS, render_table, span

Report = dict[str, Any]
Section = Callable[[Report], list[str]]

_ORDER = {"stuck": 0, "busy": 1}


def shard_lines(report: Report) -> list[str]:
    """The stuck shards, then the busy ones (oldest event first), one row each; one
    line for all the idle ones."""
    shards = report["shards"]
    active = sorted(
        (s for s in shards if s["state"] in _ORDER),
        key=lambda s: (_ORDER[s["state"]], -(s["oldest_age_s"] or 0.0), s["shard"]),
    )
    lines = [
        f"shards: {report['shard_count']} ({_count(shards, 'stuck')} stuck, "
        f"{_count(shards, 'busy')} busy, {_count(shards, 'idle')} idle; stuck: the oldest "
        f"event is older than {report['stuck_after_s']:g}s, or no worker owns the shard)"
    ]
    if active:
        lines.append(
            render_table(
                ["shard", "state", "owner", "token", "depth", "oldest_s", "in_flight", "waiting"],
                [
                    [
                        s["shard"],
                        s["state"],
                        s["owner"],
                        s["token"],
                        s["depth"],
                        s["oldest_age_s"],
                        s["in_flight"],
                        s["waiting"],
                    ]
                    for s in active
                ],
            )
        )
    idle = [s for s in shards if s["state"] == "idle"]
    if idle:
        lines.append(f"idle: {len(idle)} shard(s) {shard_ranges(s['shard'] for s in idle)}")
    if report["unowned"]:
        lines.append(f"no owner: shard(s) {shard_ranges(report['unowned'])}")
    return lines


RECORD_COLUMNS = [
    "record_key",
    "shard",
    "state",
    "event",
    "age_s",
    "reason",
    "attempts",
    "due_in_s",
    "behind",
]


def record_lines(report: Report) -> list[str]:
    """The records that wait (a back-off, a destination's limit, a debounce) or are held
    behind a dead letter: the event at their head and how old it is, why they wait, how
    often it was tried, when it is due, how many of their events wait behind it, and the
    error."""
    waiting = report.get("waiting_records") or []
    if not waiting:
        return []
    rows = [[r.get(c) for c in RECORD_COLUMNS] + [_error(r.get("error"))] for r in waiting]
    return [f"waiting records: {len(waiting)}", render_table([*RECORD_COLUMNS, "error"], rows)]


def worker_lines(report: Report) -> list[str]:
    """Each worker, the shards it owns and the age of its heartbeat."""
    workers = report["workers"]
    if not workers:
        return ["workers: none (start `keylane up` or `keylane worker`)"]
    return [
        render_table(
            ["worker", "shards", "heartbeat_age_s"],
            [[w["worker"], w["shards"], w["heartbeat_age_s"]] for w in workers],
        )
    ]


DESTINATION_COLUMNS = [
    "destination",
    "in_flight",
    "max_in_flight",
    "rate_per_s",
    "rate_now_per_s",
    "next_token_s",
    "calls",
    *CALL_OUTCOMES,
    "waits",
    "rate_cuts",
]


def destination_lines(report: Report) -> list[str]:
    """Each destination's flow control and every outcome of its calls."""
    destinations = report["destinations"]
    if not destinations:
        return []
    columns = [_short(c) for c in DESTINATION_COLUMNS]
    rows = [[_or_zero(d, c) for c in DESTINATION_COLUMNS] for d in destinations]
    return [render_table(columns, rows)]


def schedule_lines(report: Report) -> list[str]:
    """Each scheduled job: its last and next run, what was skipped or buffered."""
    schedules = report.get("schedules") or []
    if not schedules:
        return []
    return [render_table(*schedule_table(schedules))]


def schedule_table(states: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows of the jobs' table (``keylane schedules``, ``keylane status``)."""
    headers = ["job", "when", "overlap", "running", "last_run", "outcome", "next_run"]
    headers += ["started", "buffered", "skipped", "missed", "interrupted"]
    rows = [
        [
            s["job"],
            s.get("timing"),
            s.get("overlap"),
            s["running"],
            s["last_run"],
            s["last_outcome"],
            s["next_run"] if s.get("known_to_a_scheduler", True) else _unknown(s),
            *(s["ticks"][k] for k in ("started", "buffered", "skipped", "missed")),
            s["runs"]["interrupted"],
        ]
        for s in states
    ]
    return headers, rows


def _unknown(state: dict[str, Any]) -> str:
    """The next run of a job no running scheduler knows: none to say."""
    seen = state.get("scheduler_seen_s_ago")
    when = "never" if seen is None else f"{seen:.0f}s ago"
    return f"none: no scheduler has it (seen {when})"


def store_lines(report: Report) -> list[str]:
    """The store's tables (rows, age of the oldest) and the last prune."""
    retention = report.get("retention")
    if not retention:
        return []
    parts = []
    for table, t in retention["tables"].items():
        oldest = "" if t["oldest_age_s"] is None else f", oldest {span(round(t['oldest_age_s']))}"
        parts.append(f"{LABELS.get(table, table)} {t['rows']:,} rows{oldest}")
    last = retention["last_prune_age_s"]
    pruned = (
        "never pruned (keylane journal prune)"
        if last is None
        else f"last prune {span(round(last))} ago, {retention['last_prune_seconds']:.1f} s"
    )
    return ["store: " + "; ".join(parts), pruned]


def merge_lines(report: Report) -> list[str]:
    """Merges applied, undone, waiting for a person, kept apart; events forwarded
    (nothing while no merge was ever proposed)."""
    merges = report.get("merges")
    if not merges or not any(merges.values()):
        return []
    pending = merges["pending_review"]
    waiting = "? waiting" if pending is None else f"{pending} waiting for a person"
    if pending:
        waiting += " (keylane merges list)"
    return [
        f"merges: {merges['applied']} applied, {merges.get('undone', 0)} undone, {waiting}, "
        f"{merges['kept_apart']} proposed again for pairs kept apart; "
        f"{merges['forwarded']} events forwarded to survivors"
    ]


def counter_lines(report: Report) -> list[str]:
    """The deployment's counters (accepted, applied, duplicates, dead letters, ...)."""
    counters = report["counters"]
    if not counters:
        return ["counters: none yet"]
    text = ", ".join(f"{name} {value}" for name, value in sorted(counters.items()))
    return textwrap.wrap(f"counters: {text}", width=100, subsequent_indent="  ")


def backlog_lines(report: Report) -> list[str]:
    """Each source's events waiting (fair admission: a source past its share of the
    backlog is answered 429 while another's wait; ``throttled`` in the counters)."""
    backlog = report.get("backlog") or {}
    if not backlog:
        return []
    text = ", ".join(f"{name} {waiting}" for name, waiting in sorted(backlog.items()))
    return textwrap.wrap(f"waiting by source: {text}", width=100, subsequent_indent="  ")


SECTIONS: list[Section] = [
    shard_lines,
    record_lines,
    worker_lines,
    destination_lines,
    schedule_lines,
    store_lines,
    merge_lines,
    backlog_lines,
    counter_lines,
]


def render_status(report: Report) -> str:
    """The text of ``keylane status``: each section, separated by a blank line."""
    blocks = ["\n".join(lines) for section in SECTIONS if (lines := section(report))]
    return "\n\n".join(blocks)


def _error(text: str | None) -> str | None:
    """An error, on one line and short enough for a table."""
    if not text:
        return None
    line = " ".join(text.split())
    return line if len(line) <= 60 else line[:57] + "..."


def _count(shards: list[dict[str, Any]], state: str) -> int:
    return sum(1 for s in shards if s["state"] == state)


def _or_zero(row: dict[str, Any], column: str) -> object:
    """A destination's cell: counters it never counted are 0; unset limits show ``-``."""
    if column in row:
        return row[column]
    return 0 if column not in ("max_in_flight", "rate_per_s", "rate_now_per_s") else None


def _short(column: str) -> str:
    return {"rate_now_per_s": "rate_now", "max_in_flight": "max", "rate_per_s": "rate"}.get(
        column, column
    )
