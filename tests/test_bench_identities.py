"""The identities benchmark (:mod:`keylane.ops.bench.identities`): its workload, its check
of the identity index, the medians and ratios it prints, and a run at a tiny size (two
drains of 400 events, some 5 s). The full run is by hand (ops/docs/bench/identities.txt)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from keylane.ops.bench import identities as bench
from keylane.ops.bench.e2e import workload
from keylane.ops.bench.identities import (
    Options,
    Run,
    check_index,
    expected_index,
    render,
    with_identities,
)
from keylane.routing.contract.events import Envelope
from keylane.workers.store_rows import EventWrite
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore


def test_each_event_names_two_identities_of_its_own_record() -> None:
    # Given 6 events over 3 records
    work = workload("t", 6, 3)
    # When they are given identities
    named = with_identities(work)
    # Then each body names its record's two, in their normal form, and is otherwise the same
    envelopes = [Envelope.read(json.loads(b)) for b in named.bodies]
    assert [e.identities for e in envelopes[:3]] == [
        ("email:r0@example.com", "phone:+15550000000"),
        ("email:r1@example.com", "phone:+15550000001"),
        ("email:r2@example.com", "phone:+15550000002"),
    ]
    assert envelopes[3].identities == envelopes[0].identities
    assert [e.changes for e in envelopes] == [
        Envelope.read(json.loads(b)).changes for b in work.bodies
    ]
    # And the index it must leave holds 2 per record, no two records sharing one
    index = expected_index(work)
    assert len(index) == 6
    assert sorted(set(index.values())) == sorted(set(work.record_keys))


def _claimed(path: Path, claims: dict[str, tuple[str, ...]]) -> SqlStore:
    """A store where each record was written once, claiming its identities."""
    store = open_store(f"sqlite:///{path}")
    store.migrate()
    for n, (key, mine) in enumerate(claims.items()):
        store.commit_event(
            EventWrite("demo", f"e{n}", key, 0, {"n": 1}, 0, 1, identities=mine), None
        )
    return store


def test_the_index_check_finds_a_missing_or_a_stray_identity(tmp_path: Path) -> None:
    # Given two records, the second of which claimed one identity of its own and one
    # that is not its
    work = workload("t", 2, 2)
    key0, key1 = work.record_keys
    stray = (bench.identities_of(1)[0], "email:stray@example.com")
    store = _claimed(tmp_path / "s.sqlite3", {key0: bench.identities_of(0), key1: stray})
    # When the index is checked
    problems = "\n".join(check_index(store, expected_index(work)))
    store.close()
    # Then the missing identity and the stray one are both named
    assert "phone:+15550000001: names None" in problems
    assert f"email:stray@example.com: names {key1}" in problems
    assert f"{key1}: named by" in problems
    # And a store that holds exactly the index expected passes
    claims = {key0: bench.identities_of(0), key1: bench.identities_of(1)}
    good = _claimed(tmp_path / "g.sqlite3", claims)
    assert check_index(good, expected_index(work)) == []
    good.close()


def _runs() -> list[Run]:
    # baseline 1,000 and 800 events/s at 1.0 and 1.2 ms; identities 750 and 700 at 1.5 ms
    return [
        Run("baseline", 1, 2000, 2000, 2.0, 2.0, store_cpu_s=1.0),
        Run("identities", 1, 2000, 2000, 2000 / 750, 3.0, store_cpu_s=1.5),
        Run("baseline", 2, 2000, 2000, 2.5, 2.4, store_cpu_s=1.0),
        Run("identities", 2, 2000, 1400, 2.0, 2.1, store_cpu_s=1.5, from_start=True),
    ]


def test_the_medians_and_ratios_are_printed_with_the_command() -> None:
    # Given two rounds of each variant on PostgreSQL
    opts = Options("postgres", "", "", 2000, 200, 2, 16)
    # When the report is printed
    text = render(opts, _runs(), (1.0, 2.0))
    # Then each run is a row, and each variant's medians
    lines = text.splitlines()
    assert sum(1 for line in lines if line.startswith(("1 ", "2 "))) == 4
    baseline = next(line for line in lines if line.startswith("baseline "))
    assert baseline.split() == ["baseline", "2", "900", "1.100", "0.500"]
    identities = next(line for line in lines if line.startswith("identities "))
    assert identities.split() == ["identities", "2", "725", "1.500", "0.750"]
    # And the ratios of the medians, identities over baseline
    assert (
        "identities / baseline (medians): events/s 0.81, worker CPU ms/event 1.36, "
        "postgres CPU ms/event 1.50"
    ) in lines
    # And a run timed from worker start says so
    assert "1,400*" in text
    assert "timed from worker start" in text
    # And the command that reproduces it
    assert lines[-1] == (
        "reproduce: python -m keylane.ops.bench.identities --store postgres --events 2000 "
        "--keys 200 --rounds 2 --lanes 16"
    )
    # And on SQLite there is no store CPU column
    sqlite = render(replace(opts, store="sqlite"), _runs(), (1.0, 2.0))
    assert "PG CPU" not in sqlite
    assert "postgres CPU" not in sqlite


def test_a_tiny_run_drains_both_variants_and_checks_them(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the namespaces the runs make, noted
    made: list[str] = []
    new_namespace = bench.new_namespace

    def noted() -> str:
        made.append(new_namespace())
        return made[-1]

    monkeypatch.setattr(bench, "new_namespace", noted)
    # When one round of each variant drains 400 events over 40 records on SQLite
    text = bench.run(Options("sqlite", redis_url, "", 400, 40, 1, 8))
    # Then both ran, passed every check (a failed check raises) and were compared
    lines = text.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("1 ")] == [
        "baseline",
        "identities",
    ]
    assert any(line.startswith("identities / baseline (medians): events/s ") for line in lines)
    assert "the index holds exactly 80 identities, each naming its record" in text
    # And each run's namespace is gone
    client = redis.Redis.from_url(redis_url)
    try:
        assert len(made) == 2
        for namespace in made:
            assert not list(client.scan_iter(match=f"{namespace}:*", count=1000))
    finally:
        client.close()
