"""Scheduled jobs, piece by piece: when ticks fall (intervals, cron across daylight saving
changes), the ids of a run's events, and the one Redis step that decides every tick and
every run, driven by two competing schedulers against a real Redis."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis

from keylane.producers.gateway import ScheduleGateway
from keylane.producers.runs import Run, RunInfo
from keylane.producers.sender import Sender
from keylane.producers.state_reads import queue_schedule_reads, schedule_states
from keylane.routing.contract.errors import ConfigError, LeaseLost
from keylane.routing.contract.events import MAX_ID_CHARS
from keylane.routing.contract.schedules import RunLease, Timing, event_id, job_spec
from keylane.routing.contract.settings import Settings
from tests.conftest import fast_settings
from tests.support.stack import REPO, settings_env


def _ms(text: str, zone: str = "UTC") -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp() * 1000)


def _local(ms: int, zone: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")


def test_interval_ticks_count_from_the_epoch_and_report_what_was_missed() -> None:
    # Given a five-minute interval
    timing = Timing.of(every="5m")
    assert timing is not None
    # Then its ticks are the multiples of five minutes (the same in every process)
    assert timing.after(_ms("2026-12-02 15:31:07")) == _ms("2026-12-02 15:35:00")
    assert timing.after(_ms("2026-12-02 15:35:00")) == _ms("2026-12-02 15:40:00")
    # And after an absence, the latest due tick runs and the ones before it are missed
    due, missed = timing.due(_ms("2026-12-02 15:35:00"), _ms("2026-12-02 16:02:00"))
    assert due == _ms("2026-12-02 16:00:00")
    assert missed == 4  # 15:40, 15:45, 15:50, 15:55
    assert timing.due(_ms("2026-12-02 16:00:00"), _ms("2026-12-02 16:04:59")) == (None, 0)


def test_cron_runs_in_its_time_zone_across_daylight_saving_changes() -> None:
    # Given a nightly job at 02:30 in Paris
    timing = Timing.of(cron="30 2 * * *", timezone="Europe/Paris")
    assert timing is not None
    # When the clocks go forward (02:00 -> 03:00 on 2026-03-29): 02:30 does not exist,
    # and it runs right after the change, once
    ticks, t = [], _ms("2026-03-27 12:00", "Europe/Paris")
    for _ in range(4):
        t = timing.after(t)
        ticks.append(_local(t, "Europe/Paris"))
    assert ticks == [
        "2026-03-28 02:30 CET",
        "2026-03-29 03:00 CEST",
        "2026-03-30 02:30 CEST",
        "2026-03-31 02:30 CEST",
    ]
    # When the clocks go back (03:00 -> 02:00 on 2026-10-25): 02:30 exists twice, runs once
    ticks, t = [], _ms("2026-10-24 12:00", "Europe/Paris")
    for _ in range(3):
        t = timing.after(t)
        ticks.append(_local(t, "Europe/Paris"))
    assert ticks == ["2026-10-25 02:30 CEST", "2026-10-26 02:30 CET", "2026-10-27 02:30 CET"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"cron": "0 3 * * *"}, "explicit timezone"),
        ({"cron": "0 3 * *", "timezone": "UTC"}, "five fields"),
        ({"cron": "0 25 * * *", "timezone": "UTC"}, "cron="),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": "5 minutes"}, "e.g. '5m'"),
        ({"every": 0}, ">= 1"),
        ({"every": "5m", "timezone": "UTC"}, "needs no timezone"),
        ({"every": "5m", "cron": "* * * * *"}, "not both"),
    ],
)
def test_a_timing_that_cannot_work_is_refused_saying_why(kwargs: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Timing.of(**kwargs)  # type: ignore[arg-type]


def test_a_repair_must_own_its_fields_and_a_job_needs_a_timing() -> None:
    with pytest.raises(ConfigError, match="owns="):
        job_spec(lambda record: None, "repair", "fix")
    with pytest.raises(ConfigError, match="every="):
        job_spec(lambda run: None, "job", "sync")
    with pytest.raises(ConfigError, match="keylane's own"):
        job_spec(lambda run: None, "job", "keylane.prune", every="1h")


def test_event_ids_are_the_same_on_every_attempt_and_fit_the_limit() -> None:
    tick = _ms("2026-12-02 15:30:00")
    assert event_id("pull", tick, "contact:42") == "pull@2026-12-02T15:30:00Z/contact:42"
    long_key = "k:" + "x" * 500
    first, again = event_id("pull", tick, long_key), event_id("pull", tick, long_key)
    assert first == again
    assert len(first) <= MAX_ID_CHARS
    assert event_id("pull", tick + 300_000, "contact:42") != event_id("pull", tick, "contact:42")


# -- the step, against a real Redis ------------------------------------------------------


@pytest.fixture
def sched_settings(redis_url: str, namespace: str, tmp_path: Path) -> Settings:
    return fast_settings(redis_url, namespace, f"sqlite:///{tmp_path / 's.sqlite3'}", tmp_path)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _state(settings: Settings, job: str) -> dict[str, int]:
    client = redis.Redis.from_url(settings.redis_dsn())
    pipe = client.pipeline()
    queue_schedule_reads(pipe, settings.keys, [job])
    (state,) = schedule_states(pipe.execute(), [job])
    client.close()
    return {**state.ticks, **{f"runs_{k}": v for k, v in state.runs.items()}}


def test_two_schedulers_stepping_one_tick_start_one_run_and_count_the_rest(
    sched_settings: Settings, loop: asyncio.AbstractEventLoop
) -> None:
    async def scenario() -> None:
        a = ScheduleGateway.from_url(sched_settings.redis_dsn(), sched_settings.keys)
        b = ScheduleGateway.from_url(sched_settings.redis_dsn(), sched_settings.keys)
        try:
            last = await a.register("sync", {}, 1000)
            await b.register("sync", {}, 1000)

            async def step(gw: ScheduleGateway, owner: str, due: int, last: str) -> str:
                reply = await gw.step("sync", owner, 60_000, due, 0, last, "buffer_one", "rerun")
                return reply.kind

            # Given two schedulers that both see tick 2000 due
            kinds = await asyncio.gather(step(a, "A", 2000, last), step(b, "B", 2000, last))
            # Then one starts the run, and the other's step is stale (already handled)
            assert sorted(kinds) == ["stale", "start"]
            # When the next two ticks come while the run still goes (buffer_one)
            assert await step(a, "A", 3000, "2000") == "none"
            assert await step(b, "B", 4000, "3000") == "none"
            # Then one is buffered and the other skipped, both counted
            counts = _state(sched_settings, "sync")
            assert (counts["started"], counts["buffered"], counts["skipped"]) == (1, 1, 1)
        finally:
            await a.close()
            await b.close()

    loop.run_until_complete(scenario())


def test_a_run_whose_lease_expired_is_run_again_and_its_late_sends_are_refused(
    sched_settings: Settings, loop: asyncio.AbstractEventLoop
) -> None:
    keys = sched_settings.keys
    client = redis.Redis.from_url(sched_settings.redis_dsn())
    sender = Sender(sched_settings)

    async def scenario() -> None:
        gw = ScheduleGateway.from_url(sched_settings.redis_dsn(), keys)
        try:
            last = await gw.register("sync", {}, 1000)
            # Given a run started by scheduler A, whose lease then expires (A paused)
            first = await gw.step("sync", "A", 60_000, 2000, 0, last, "skip", "rerun")
            assert first.kind == "start"
            lease_a = RunLease("sync", keys.schedule_lease("sync"), f"A/{first.token}")
            run_a = Run(RunInfo("sync", 2000, None, 1, first.token), lease_a, sender, "sync")
            run_a.change("contact:1", {"n": {"increment": 1}})
            client.delete(keys.schedule_lease("sync"))
            # When scheduler B steps the job
            second = await gw.step("sync", "B", 60_000, None, 0, "2000", "skip", "rerun")
            # Then B runs the same tick again, as attempt 2 with a newer token
            assert (second.kind, second.tick, second.attempt) == ("start", 2000, 2)
            assert second.token > first.token
            # And A, waking up, can send nothing more: its lease value is gone
            with pytest.raises(LeaseLost):
                run_a.change("contact:2", {"n": {"increment": 1}})
            # And B's send of what A already sent is a duplicate: one effect
            lease_b = RunLease("sync", keys.schedule_lease("sync"), f"B/{second.token}")
            run_b = Run(RunInfo("sync", 2000, None, 2, second.token), lease_b, sender, "sync")
            assert run_b.change("contact:1", {"n": {"increment": 1}}).status == "duplicate"
            assert run_b.change("contact:2", {"n": {"increment": 1}}).status == "accepted"
            # And A cannot record the run's end; B can
            assert not await gw.finish(lease_a, 2000, first.token, "ok", "", 1, 0)
            assert await gw.finish(lease_b, 2000, second.token, "ok", "", 2, 1)
            counts = _state(sched_settings, "sync")
            assert (counts["runs_interrupted"], counts["runs_rerun"], counts["runs_ok"]) == (
                1,
                1,
                1,
            )
        finally:
            await gw.close()

    try:
        loop.run_until_complete(scenario())
    finally:
        sender.close()
        client.close()
    log = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in redis.Redis.from_url(sched_settings.redis_dsn()).xrange(keys.schedule_log)
    ]
    assert [e["event"] for e in log] == ["started", "interrupted", "started", "finished"]


def test_keylane_schedules_says_when_no_running_scheduler_knows_a_job(
    sched_settings: Settings, loop: asyncio.AbstractEventLoop
) -> None:
    keys = sched_settings.keys
    client = redis.Redis.from_url(sched_settings.redis_dsn())

    async def scenario() -> None:
        gw = ScheduleGateway.from_url(sched_settings.redis_dsn(), keys)
        try:
            # Given two jobs a scheduler knows: it steps them (and notes their next runs)
            for job in ("kept", "dropped"):
                last = await gw.register(job, {"timing": "every 60s"}, 1000)
                await gw.step(job, "A", 60_000, None, 0, last, "skip", "rerun")
                await gw.set_next(job, 4_000_000_000_000)
        finally:
            await gw.close()

    loop.run_until_complete(scenario())
    # When one of them has not been stepped for ten minutes (the app no longer has it)
    now_ms = int(client.time()[0]) * 1000
    client.hset(keys.schedule("dropped"), "stepped_at", str(now_ms - 600_000))
    client.close()
    env = settings_env(sched_settings)
    shown = {
        s["job"]: s
        for s in json.loads(
            subprocess.run(
                [sys.executable, "-m", "keylane.ops.cli", "schedules", "--json"],
                env=env, cwd=REPO, capture_output=True, text=True, check=True,
            ).stdout
        )
    }  # fmt: skip
    # Then the listing says which job no running scheduler knows, and gives it no next run
    assert shown["kept"]["known_to_a_scheduler"] is True
    assert shown["kept"]["next_run"] is not None
    assert shown["dropped"]["known_to_a_scheduler"] is False
    assert shown["dropped"]["next_run"] is None
    assert shown["dropped"]["scheduler_seen_s_ago"] >= 600
    table = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "schedules"],
        env=env, cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    dropped = next(line for line in table.splitlines() if line.startswith("dropped"))
    # (how long ago depends on when this CLI run happened: at least the ten minutes set)
    seen = re.search(r"none: no scheduler has it \(seen (\d+)s ago\)", dropped)
    assert seen is not None, dropped
    assert int(seen.group(1)) >= 600
