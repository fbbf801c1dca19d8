"""The benchmark's trickle part (``python -m keylane.ops.bench --only trickle``): a short
run starts a receiver and one worker on a Redis server of its own, sends a trickle, prints
the Redis commands and CPU per event, and checks the store."""

from __future__ import annotations

import json

import pytest

from tests.support.bench_runs import run_bench


@pytest.mark.slow
def test_a_short_trickle_prints_its_table_and_holds_the_invariants(redis_url: str) -> None:
    # Given the bench run for one rate, three seconds, over 50 keys
    args = ["--only", "trickle", "--rates", "20", "--seconds", "3", "--keys", "50"]
    result = run_bench("keylane.ops.bench", *args, "--redis-url", redis_url, timeout_s=240)
    # Then it ends well, with the per-rate table, the commands by name and the check
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "(d) trickle" in out
    for heading in ("REDIS CMDS/EV", "WORKER CPU MS/EV", "Redis commands per event by name"):
        assert heading in out
    assert "evalsha" in out
    assert "invariants: OK" in out
    # And the JSON line says the same: 60 events, each costing some Redis commands (the
    # accept's script alone runs several), every record's sum exact
    summary = json.loads(out.strip().splitlines()[-1])
    trickle = summary["trickle"]
    assert trickle["invariants"] == "OK"
    (run,) = trickle["runs"]
    assert run["events"] == 60
    assert run["redis_commands_per_event"] > 5
    assert run["commands_per_event"]["evalsha"] >= 2
    assert trickle["idle"]["seconds"] >= 2
