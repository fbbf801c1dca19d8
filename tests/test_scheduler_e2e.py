"""Scheduled jobs with real processes: two schedulers, a worker, a real Redis and store.

1. A job whose runs take longer than its interval, for about a minute: its runs never
   overlap (from the run log, and from the job's own notes of when it ran), and every
   tick is accounted for exactly once, as its overlap policy says.
2. ``kill -9`` of the scheduler running a job, mid-run: the other takes the tick over and
   runs it again; no two runs overlap, and every event of the interrupted run has exactly
   one effect.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
import redis

from keylane.routing.contract.schedule_state import ScheduleState
from keylane.routing.contract.schedules import tick_text
from tests.support.scheduled_jobs import notes
from tests.support.stack import REPO, Proc, Stack, settings_env, wait_until

pytestmark = pytest.mark.slow

APP = "tests.support.scheduled_jobs"


def _log(stack: Stack, job: str) -> list[dict[str, str]]:
    return [e for e in stack.view().schedule_log() if e["job"] == job]


def _runs(log: list[dict[str, str]]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The job's runs from its log, checking that they never overlap: every start is
    followed by the end of that very run (finished, or interrupted) before the next
    start, and each run's fencing token is larger than the one before."""
    runs, going, token = [], None, 0
    for entry in log:
        if entry["event"] == "started":
            assert going is None, f"run {entry} started while {going} was going"
            assert int(entry["token"]) > token, entry
            going, token = entry, int(entry["token"])
        elif entry["event"] in ("finished", "interrupted"):
            assert going is not None, f"{entry} ended no run"
            assert (entry["tick"], entry["token"]) == (going["tick"], going["token"]), entry
            runs.append((going, entry))
            going = None
    assert going is None, f"a run never ended: {going}"
    return runs


def _records(stack: Stack, job: str, count: int) -> list[dict[str, Any]]:
    store = stack.open_store()
    return [store.read(f"{job}:{i}").fields for i in range(count)]


def _stop_schedulers(procs: list[Proc]) -> None:
    for proc in procs:
        assert proc.stop(timeout_s=60) == 0, proc.log()[-3000:]


def _wait_applied(stack: Stack, job: str, events: int) -> None:
    store = stack.open_store()
    wait_until(
        lambda: sum(1 for e in store.journal_entries() if e.source == job) >= events,
        120,
        f"{events} events of {job} applied",
        on_timeout=stack.logs,
    )


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_job_longer_than_its_interval_never_laps_itself(stack: Stack) -> None:
    # Given two jobs every 2 s whose runs take 2.5 to 5 s, one that skips the ticks that
    # come during a run (the default) and one that buffers one, under two schedulers
    stack.extra_env.update(
        TEST_JOBS="slow_skip,slow_buffer", TEST_JOB_EVERY="2s", TEST_JOB_DURATION="2.5,5"
    )
    stack.worker(app=APP)
    schedulers = [stack.scheduler(app=APP), stack.scheduler(app=APP)]
    # When they run for about a minute (until each job has finished 12 runs)
    wait_until(
        lambda: all(
            sum(e["event"] == "finished" for e in _log(stack, job)) >= 12
            for job in ("slow_skip", "slow_buffer")
        ),
        300,
        "12 runs of each job",
        on_timeout=stack.logs,
    )
    _stop_schedulers(schedulers)  # each lets its run in progress finish
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    seen = notes(client, stack.settings.namespace)
    states = {s.job: s for s in stack.view().schedules()}
    owners = set()
    for job in ("slow_skip", "slow_buffer"):
        log = _log(stack, job)
        # Then the run log shows no two runs of a job at once
        runs = _runs(log)
        assert all(end["event"] == "finished" for _, end in runs)
        owners |= {start["owner"] for start, _ in runs}
        # And neither did the job's own notes of when it ran (two processes, one clock)
        spans = sorted(
            (n["at"], m["at"])
            for n in seen
            if n["kind"] == "start" and n["job"] == job
            for m in seen
            if m["kind"] == "end" and m["job"] == job and m["tick"] == n["tick"]
        )
        assert len(spans) == len(runs)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        # And every tick from the first to the last is accounted for exactly once
        kinds = Counter(e["event"] for e in log)
        started = [s["tick"] for s, _ in runs]
        buffered = [e["tick"] for e in log if e["event"] == "buffered"]
        skipped = [e["tick"] for e in log if e["event"] == "skipped"]
        missed = sum(int(e["count"]) for e in log if e["event"] == "missed")
        assert len(set(started)) == len(started)
        assert not set(skipped) & set(started)
        waiting = set(buffered) - set(started)  # buffered, not run when the schedulers stopped
        assert waiting == ({str(states[job].buffered_tick)} if waiting else set())
        ticks = sorted(int(t) for t in {*started, *skipped, *waiting})
        expected = (ticks[-1] - ticks[0]) // 2000 + 1
        assert len(ticks) + missed == expected, (len(ticks), missed, expected)
        # And the policy decided: skip buffers nothing; buffer_one buffers, and skips
        # only when a tick already waits
        state = states[job]
        assert state.ticks == {
            "started": len(started) - len(set(buffered) - waiting),
            "buffered": len(buffered),
            "skipped": len(skipped),
            "missed": missed,
        }
        assert kinds["skipped"] > 0
        if job == "slow_skip":
            assert not buffered
        else:
            assert buffered
            assert {e.get("policy") for e in log if e["event"] == "skipped"} == {"buffer_one"}
        # And each run's events had one effect each, in run order, on every record
        _wait_applied(stack, job, 4 * len(runs))
        for fields in _records(stack, job, 4):
            assert fields["ticks"] == [tick_text(int(t)) for t in started]
            assert fields["runs"] == len(runs)
    # And both schedulers ran some (a buffered tick is started by the scheduler whose run
    # just ended, so one job alone may stay with one of them)
    assert len(owners) == 2
    # And `keylane schedules --json` shows the same counts
    shown = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "schedules", "--json"],
        env=settings_env(stack.settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    listed = {s["job"]: s for s in json.loads(shown.stdout)}
    assert listed["slow_skip"]["ticks"] == states["slow_skip"].ticks
    assert listed["slow_buffer"]["overlap"] == "buffer_one"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_kill_9_of_the_active_scheduler_mid_run_hands_the_tick_to_the_standby(
    stack: Stack,
) -> None:
    # Given a job every 3 s whose runs send 10 events over 4 s, and two schedulers
    stack.extra_env.update(
        TEST_JOBS="slow_skip", TEST_JOB_EVERY="3s", TEST_JOB_DURATION="4,4", TEST_JOB_RECORDS="10"
    )
    stack.worker(app=APP)
    schedulers = [stack.scheduler(app=APP), stack.scheduler(app=APP)]
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    killed_ticks = []
    caught: list[ScheduleState] = []
    for _ in range(2):
        # When the scheduler running the job is killed (-9) once a run has sent 3 events
        def mid_run() -> bool:
            state = next((s for s in stack.view().schedules() if s.job == "slow_skip"), None)
            if state is None or state.running_tick is None or state.runner is None:
                return False
            caught[:] = [state]
            tick = tick_text(state.running_tick)
            sent = [
                n
                for n in notes(client, stack.settings.namespace)
                if n["kind"] == "sent" and n["tick"] == tick and n["n"] >= 3
            ]
            return bool(sent) and sent[-1]["pid"] == int(state.runner.split(":")[1])

        wait_until(mid_run, 60, "a run halfway", on_timeout=stack.logs)
        (state,) = caught
        assert state.runner is not None
        victim = next(p for p in schedulers if p.pid == int(state.runner.split(":")[1]))
        victim.kill()
        schedulers.remove(victim)
        assert state.running_tick is not None
        killed_ticks.append(str(state.running_tick))
        # Then the standby runs that tick again (attempt 2) to the end
        wait_until(
            lambda t=killed_ticks[-1]: any(
                e["event"] == "finished" and e["tick"] == t for e in _log(stack, "slow_skip")
            ),
            60,
            "the interrupted tick to be run again",
            on_timeout=stack.logs,
        )
        schedulers.append(stack.scheduler(app=APP))  # a new standby
    _stop_schedulers(schedulers)
    log = _log(stack, "slow_skip")
    # And no two runs ever overlapped
    runs = _runs(log)
    finished = [start["tick"] for start, end in runs if end["event"] == "finished"]
    for tick in killed_ticks:
        ends = [(s, e) for s, e in runs if s["tick"] == tick]
        assert [e["event"] for _, e in ends] == ["interrupted", "finished"]
        (first, _), (again, done) = ends
        assert again["attempt"] == "2"
        assert again["owner"] != first["owner"]
        assert int(done["duplicates"]) >= 3  # what the killed run sent was not sent twice
    # And every event of every run, the interrupted ones included, had exactly one effect
    _wait_applied(stack, "slow_skip", 10 * len(finished))
    store = stack.open_store()
    ids = Counter(e.event_id for e in store.journal_entries() if e.source == "slow_skip")
    assert len(ids) == 10 * len(finished)
    assert set(ids.values()) == {1}
    for fields in _records(stack, "slow_skip", 10):
        assert fields["ticks"] == [tick_text(int(t)) for t in finished]
        assert fields["runs"] == len(finished)
