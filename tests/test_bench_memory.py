"""The memory benchmark (``python -m keylane.ops.bench.memory``): a short run starts a
receiver and one worker on a Redis server of its own, sends events, drains them, and prints
Redis's bytes per event (the marks, the told outcomes), by key family, and the sizing."""

from __future__ import annotations

import json

import pytest

from keylane.ops.bench.memory import THREE_DAYS_S, Density, ids_per_hash, sizing_mb
from tests.support.bench_runs import run_bench


def test_the_sizing_adds_the_marks_of_the_window_and_the_outcomes_kept() -> None:
    # Given ids of 30 bytes at 100 events/s, and told outcomes of 300 bytes kept an hour
    density = Density(100, ids_per_hash(100), 30.0, "hashtable")
    # Then three days take the window's ids and an hour's outcomes
    assert density.ids_per_hash == 2109
    expected = (100 * THREE_DAYS_S * 30 + 100 * 3600 * 300) / 1e6
    assert sizing_mb(100, THREE_DAYS_S, density, 300.0, 3600) == pytest.approx(expected)
    # And a window shorter than the keep keeps the outcomes no longer than the window
    assert sizing_mb(100, 60, density, 300.0, 3600) == pytest.approx(100 * 60 * 330 / 1e6)


@pytest.mark.slow
def test_a_short_run_prints_bytes_per_event_by_part_and_the_sizing() -> None:
    # Given the bench run for this tree: 300 events over 100 keys, one sizing rate
    args = ["--events", "300", "--keys", "100", "--rates", "10", "--json"]
    result = run_bench("keylane.ops.bench.memory", *args, timeout_s=300)
    # Then it ends well, with its tables
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for heading in ("(a) Redis bytes per event", "by key family", "(b) the marks by rate"):
        assert heading in out
    # And the JSON line: every event's outcome was told and kept an hour, each id
    # remembered in its source's hashes, none in a key of its own
    summary = json.loads(out.strip().splitlines()[-1])
    (tree,) = summary["trees"]
    assert tree["told_kept_s"] == 3600
    assert tree["told_b"] > 0
    assert tree["families"]["outcome"][0] == 300
    assert "seen-ids" in tree["families"]
    assert "seen" not in tree["families"]
    (sizing,) = summary["sizing"]
    assert sizing["ids_per_hash"] == 211
    assert 0 < sizing["per_id_b"] < 100
