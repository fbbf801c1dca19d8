"""ops/status_text.py: ``keylane status`` as text, from a report shaped as
:func:`keylane.ops.status.collect_status` builds it."""

from __future__ import annotations

from typing import Any

from keylane.ops.status_text import (
    counter_lines,
    destination_lines,
    record_lines,
    render_status,
    schedule_table,
    shard_lines,
    store_lines,
    worker_lines,
)


def shard(
    number: int, state: str, oldest_age_s: float | None = None, **rest: Any
) -> dict[str, Any]:
    row = {"shard": number, "state": state, "owner": "w1", "token": 4, "depth": 0}
    row |= {"oldest_age_s": oldest_age_s, "in_flight": 0, "waiting": 0}
    return row | rest


def report(**parts: Any) -> dict[str, Any]:
    """A quiet deployment of 8 shards, one worker; ``parts`` replace any section."""
    base: dict[str, Any] = {
        "shard_count": 8,
        "stuck_after_s": 60.0,
        "shards": [shard(n, "idle") for n in range(8)],
        "unowned": [],
        "workers": [{"worker": "w1", "shards": 8, "heartbeat_age_s": 0.4}],
        "counters": {"accepted": 3, "applied": 3},
        "waiting_records": [],
        "destinations": [],
        "schedules": [],
    }
    return base | parts


def test_stuck_shards_come_first_then_busy_ones_oldest_first_and_idle_ones_in_one_line() -> None:
    shards = [shard(n, "idle") for n in range(8)]
    shards[1] = shard(1, "busy", 2.0, depth=1)
    shards[2] = shard(2, "busy", 9.0, depth=3)
    shards[6] = shard(6, "stuck", 1.0, owner=None, token=None, depth=1)
    lines = shard_lines(report(shards=shards, unowned=[6]))
    assert lines[0] == (
        "shards: 8 (1 stuck, 2 busy, 5 idle; stuck: the oldest event is older than 60s, "
        "or no worker owns the shard)"
    )
    table = lines[1].splitlines()
    assert table[0].split() == [
        "SHARD", "STATE", "OWNER", "TOKEN", "DEPTH", "OLDEST_S", "IN_FLIGHT", "WAITING"
    ]  # fmt: skip
    assert [row.split()[:2] for row in table[1:]] == [["6", "stuck"], ["2", "busy"], ["1", "busy"]]
    assert lines[2:] == ["idle: 5 shard(s) 0, 3-5, 7", "no owner: shard(s) 6"]


def test_a_quiet_deployment_shows_no_shard_table() -> None:
    assert shard_lines(report())[1:] == ["idle: 8 shard(s) 0-7"]


def test_waiting_records_show_their_error_on_one_short_line() -> None:
    waiting = {
        "record_key": "contact:1",
        "shard": 2,
        "state": "waiting",
        "reason": "back-off",
        "error": "HTTP 503\n   from   upstream " + "x" * 80,
    }
    title, table = record_lines(report(waiting_records=[waiting]))
    assert title == "waiting records: 1"
    header, row = table.splitlines()
    assert header.split()[-1] == "ERROR"
    assert row.endswith("HTTP 503 from upstream " + "x" * 34 + "...")
    assert record_lines(report()) == []


def test_no_workers_says_how_to_start_one() -> None:
    assert worker_lines(report(workers=[])) == [
        "workers: none (start `keylane up` or `keylane worker`)"
    ]


def test_a_destinations_uncounted_outcomes_are_zero_and_unset_limits_a_dash() -> None:
    row = {"destination": "crm", "in_flight": 1, "rate_per_s": 5.0, "calls": 7, "done": 6}
    (table,) = destination_lines(report(destinations=[row]))
    header, cells = (line.split() for line in table.splitlines())
    shown = dict(zip(header, cells, strict=True))
    assert shown["DESTINATION"] == "crm"
    assert (shown["MAX"], shown["RATE"], shown["RATE_NOW"]) == ("-", "5.0", "-")
    assert (shown["CALLS"], shown["DONE"], shown["FAILED"], shown["RATE_CUTS"]) == (
        "7",
        "6",
        "0",
        "0",
    )


def test_a_job_no_scheduler_knows_says_when_one_was_last_seen() -> None:
    job = {
        "job": "nightly",
        "running": False,
        "last_run": None,
        "last_outcome": None,
        "next_run": "2030-01-01 00:00:00",
        "ticks": {"started": 1, "buffered": 0, "skipped": 2, "missed": 0},
        "runs": {"interrupted": 0},
    }
    _, (known,) = schedule_table([job])
    _, (unknown,) = schedule_table([job | {"known_to_a_scheduler": False}])
    _, (never,) = schedule_table(
        [job | {"known_to_a_scheduler": False, "scheduler_seen_s_ago": 42.4}]
    )
    assert known[6] == "2030-01-01 00:00:00"
    assert unknown[6] == "none: no scheduler has it (seen never)"
    assert never[6] == "none: no scheduler has it (seen 42s ago)"
    assert known[7:] == [1, 0, 2, 0, 0]


def test_the_store_section_names_each_table_and_the_last_prune() -> None:
    retention = {
        "tables": {
            "journal": {"rows": 12345, "oldest_age_s": 7200.0},
            "dead_letters": {"rows": 0, "oldest_age_s": None},
        },
        "last_prune_age_s": None,
        "last_prune_seconds": None,
    }
    assert store_lines(report(retention=retention)) == [
        "store: journal 12,345 rows, oldest 2h; dead_letters (closed) 0 rows",
        "never pruned (keylane journal prune)",
    ]
    pruned = retention | {"last_prune_age_s": 120.0, "last_prune_seconds": 1.25}
    assert store_lines(report(retention=pruned))[1] == "last prune 2m ago, 1.2 s"
    assert store_lines(report()) == []


def test_counters_are_sorted_and_wrapped() -> None:
    counters = {f"counter_{n:02d}": n for n in range(12)}
    lines = counter_lines(report(counters=counters))
    assert lines[0].startswith("counters: counter_00 0, counter_01 1")
    assert len(lines) > 1
    assert all(len(line) <= 100 for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert counter_lines(report(counters={})) == ["counters: none yet"]


def test_the_report_is_its_non_empty_sections_separated_by_blank_lines() -> None:
    text = render_status(report())
    assert text.split("\n\n") == [
        shard_lines(report())[0] + "\nidle: 8 shard(s) 0-7",
        "WORKER  SHARDS  HEARTBEAT_AGE_S\nw1      8       0.4",
        "counters: accepted 3, applied 3",
    ]
