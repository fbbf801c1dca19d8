"""The delivery-cost benchmark (:mod:`keylane.ops.bench.delivery_cost`) runs as the
Deliveries and Benchmarks pages write it (smaller), on SQLite and PostgreSQL, and what it
measures holds: a kept delivery costs at least its body in the store, and an event that
carries its delivery's request is larger by at least that request."""

from __future__ import annotations

import re

from keylane.ops.bench.delivery_cost import message_of, request_of
from tests.support.bench_runs import run_bench


def test_the_benchmark_prints_both_stores_and_both_bodies(pg_url: str) -> None:
    # When the page's command runs, smaller
    args = ["--rows", "50", "--events", "50", "--rounds", "1", "--pg-url", pg_url]
    done = run_bench("keylane.ops.bench.delivery_cost", *args, timeout_s=600)
    assert done.returncode == 0, done.stderr
    # Then each body has a figure per store, the one at the cap at least its body
    stored = re.findall(r"\((\d+) bytes\): sqlite (\d+), postgresql (\d+)", done.stdout)
    assert len(stored) == 2, done.stdout
    for body, lite, pg in stored:
        assert int(lite) > int(body)
        assert int(pg) > int(body)
    # And the queue and lane figures say before -> after for both bodies
    assert len(re.findall(r"message (\d+) -> (\d+) bytes", done.stdout)) == 2


def test_an_event_that_carries_its_request_is_larger_by_at_least_the_request() -> None:
    for size in (None, 16 * 1024):
        before, after = message_of(1, size, False), message_of(1, size, True)
        body = request_of(1, size)["body"]
        assert len(after) - len(before) > len(body)
