"""The told-outcomes benchmark's arithmetic (:mod:`keylane.ops.bench.told`): the lanes'
time read from their histogram, and the ratios it prints. The benchmark itself starts a
receiver per part and a worker, some 80 s: it is run by hand (ops/docs/outcomes.md)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from keylane.ops.bench.told import (
    LaneTime,
    Load,
    Memory,
    Phase,
    ToldOptions,
    lane_time,
    render,
)
from tests.support.stack import REPO


def test_the_lanes_time_is_the_histograms_growth_between_two_readings() -> None:
    # Given a histogram read before a phase and after it: 100 more events, 90 of them
    # decided within 10 ms (bucket 0.01) and 10 within 100 ms (bucket 0.1)
    before = {"0.01": 5.0, "count": 5.0, "sum": 0.02}
    after = {"0.01": 95.0, "0.1": 10.0, "count": 105.0, "sum": 1.52}
    # When the lanes' time is read from the two
    lane = lane_time(before, after)
    # Then the mean is exact, and the percentiles fall in their buckets
    assert lane.events == 100
    assert abs(lane.mean_s - 0.015) < 1e-9
    assert 0.005 < lane.p50_s <= 0.01
    assert 0.05 < lane.p99_s <= 0.1
    # And a phase that decided nothing reads as zeros
    assert lane_time(after, after) == LaneTime(0, 0.0, 0.0, 0.0)


def _phase(mode: str, requests: int, receiver_cpu_s: float) -> Phase:
    load = Load(requests, 10.0, 5.0, 20.0, requests if mode != "202" else 0, 0, 0, 0, 0.3)
    return Phase(
        mode, 32, load, requests, receiver_cpu_s, 0.0, 1.0, requests, 5.0, LaneTime(0, 0, 0, 0)
    )


def _docs_hooks(monkeypatch: pytest.MonkeyPatch) -> Any:
    """ops/docs_hooks.py, loaded by its path as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "ops" / "docs_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "docs_hooks", hooks)  # dataclasses look it up
    spec.loader.exec_module(hooks)
    return hooks


def test_the_checked_in_output_is_charted_on_the_outcomes_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the output the outcomes page draws its chart from
    text = (REPO / "ops" / "docs" / "bench" / "told.txt").read_text()
    # Then it has a table of the three modes for each client count, and the page charts it
    tables = [t for t in _docs_hooks(monkeypatch).read_tables(text) if "CPU MS/REQ" in t.columns]
    assert [t.title for t in tables] == ["(a) 32 concurrent clients", "(a) 512 concurrent clients"]
    assert all([r[0] for r in t.rows] == ["202", "wait=10", "202 paced"] for t in tables)
    page = (REPO / "ops" / "docs" / "outcomes.md").read_text()
    assert '<!-- keylane:chart bench/told.txt "CPU MS/REQ" -->' in page


def test_the_printed_ratios_and_the_charted_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a 202 phase at 0.2 ms of receiver CPU a request, a waited one at 0.35 ms, and
    # the 202 path at the waited one's rate at 0.25 ms
    opts = ToldOptions("sqlite", "", "", 1, 16, 10, (32,), 10, (1000,), 2, False)
    phases = [
        _phase("202", 10_000, 2.0),
        _phase("wait=10", 8_000, 2.8),
        _phase("202 paced", 8_000, 2.0),
    ]
    memory = [Memory(1000, 60_000, 63_000, 75_000, 0)]
    # When the tables are printed
    text = render(opts, phases, memory, (1.0, 1.0, 1.0))
    # Then both ratios are computed in the run and held against the target: at the same
    # clients (1.75, missed) and at the same rate (1.40, met)
    (row,) = [line for line in text.splitlines() if line.startswith("32 ")]
    assert row.split()[-3:] == ["MISSED", "1.40", "met"]
    assert "1.75" in row
    # And the docs' chart reader finds each table with every row (ops/docs_hooks.py)
    hooks = _docs_hooks(monkeypatch)
    tables = {t.title: t for t in hooks.read_tables(text)}
    assert [r[0] for r in tables["(a) 32 concurrent clients"].rows] == [
        "202",
        "wait=10",
        "202 paced",
    ]
    assert "CPU MS/REQ" in tables["(a) 32 concurrent clients"].columns
    assert [r[4] for r in next(t for t in tables.values() if "WAITING" in t.columns).rows] == [
        "15.0"
    ]
    # And the command that reproduces it
    assert "reproduce: python -m keylane.ops.bench.told --store sqlite" in text
