"""One owner per shard, enforced, and nothing lost or reordered when anything dies:
real worker processes, real ``kill -9``/``SIGSTOP``, a real Redis killed mid-run."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from keylane.ops.audit import audit_journal, audit_lease_log
from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.routing.contract.settings import FaultSpec, Settings
from tests.support.load import SequentialLoad
from tests.support.stack import Stack, event, wait_until

# Several worker processes at once: PostgreSQL (SQLite takes one writer process; its one
# writer is tested in tests/test_paused_worker.py).
pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store_url", ["postgres"], indirect=True)]


def _owners(stack: Stack) -> set[str]:
    return {h.rsplit("/", 1)[0] for h in stack.view().lease_values().values()}


def _audit(stack: Stack) -> None:
    assert audit_lease_log(stack.view().lease_events()) == []
    assert audit_journal(stack.open_store().journal_entries()) == []


def test_workers_join_and_leave_under_load_without_overlap(stack: Stack) -> None:
    # Given three workers sharing the shards, and steady ordered load on 50 keys
    for _ in range(3):
        stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned(workers=3)
    load = SequentialLoad(stack, [f"member:{k}" for k in range(50)], per_key=40).start()
    # When a fourth worker joins under load
    wait_until(lambda: load.progress() > 0.2, 120, "some load")
    stack.worker(lanes=2)
    stack.wait_all_owned(workers=4)
    # And then one worker stops gracefully under load
    wait_until(lambda: load.progress() > 0.5, 120, "more load")
    assert stack.procs[0].stop() == 0
    stack.wait_all_owned(workers=3)
    load.join()
    stack.wait_journal(load.total)
    # Then every event was applied once and in order, and no shard ever had two owners
    load.verify(stack.open_store())
    _audit(stack)
    events = stack.view().lease_events()
    assert any(e["event"] == "released" for e in events), "the stopped worker handed off"
    assert all(e["expired"] == "" for e in events if e["event"] == "acquired"), (
        "graceful handoffs never wait for a lease to expire"
    )


def test_kill_minus_nine_ten_times_loses_and_reorders_nothing(stack: Stack) -> None:
    # Given three workers and 5,000 ordered events on 50 keys
    for _ in range(3):
        stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned(workers=3)
    load = SequentialLoad(stack, [f"crash:{k}" for k in range(50)], per_key=100).start()
    # When a random worker is killed with SIGKILL ten times, paced by the load's progress
    # (at 1/11, 2/11, ... of the events sent, so every kill lands while events flow, however
    # fast or slow the machine), and a new worker is started after each kill
    rng = random.Random(5)
    kills_at: list[float] = []
    for kill in range(1, 11):
        wait_until(
            lambda kill=kill: load.progress() >= kill / 11, 300, f"progress before kill {kill}"
        )
        victim = rng.choice([p for p in stack.procs if p.name.startswith("worker") and p.alive()])
        victim.kill()
        kills_at.append(load.progress())
        stack.worker(lanes=2)
    load.join()
    stack.wait_journal(load.total, timeout_s=180)
    # Then sums and order are exact and each event id has one journal entry
    assert len(kills_at) == 10, kills_at
    load.verify(stack.open_store())
    assert stack.open_store().journal_size() == load.total
    _audit(stack)
    takeovers = [e for e in stack.view().lease_events() if e["expired"]]
    assert takeovers, "killed workers' shards were taken over after their leases expired"


def test_paused_owner_is_fenced_off_after_takeover(stack: Stack) -> None:
    # Given a worker that pauses inside its first write to paused:1
    stack.settings.faults.append(
        FaultSpec(
            point="worker.before_write", action="sleep", sleep_ms=4000, match="paused:", times=1
        )
    )
    paused = stack.worker(lanes=2)
    stack.settings.faults.clear()
    stack.receiver()
    stack.wait_all_owned(workers=1)
    shard = stack.settings.shards.shard_for_key("paused:1")
    assert stack.post(event("p-1", "paused:1", seq={"append": 1})).status_code == 202
    # (in its injected sleep, not merely handed p-1: a worker stopped before the write
    # begins may find its lease gone on waking and never try the write)
    wait_until(lambda: "fault injected: sleep at worker.before_write" in paused.log(), 30,
               "p-1 in flight, its write under way", on_timeout=paused.log)  # fmt: skip
    old_token = int(stack.view().lease_values()[shard].rsplit("/", 1)[1])
    # When it is stopped (SIGSTOP) for longer than the lease TTL while it holds p-1
    paused.signal(signal.SIGSTOP)
    try:
        stack.worker(lanes=2)
        wait_until(
            lambda: paused_gone(stack, old_token, shard),
            30,
            "another worker to take the shard over",
        )
        # Then the new owner restores p-1 at the head, applies it, and goes on with p-2
        assert stack.post(event("p-2", "paused:1", seq={"append": 2})).status_code == 202
        stack.wait_journal(2)
    finally:
        paused.signal(signal.SIGCONT)
    # And when the paused worker wakes up, its late write is refused by the fence
    wait_until(
        lambda: "fencing token" in paused.log(),
        20,
        "the paused worker to be fenced",
        on_timeout=paused.log,
    )
    assert stack.post(event("p-3", "paused:1", seq={"append": 3})).status_code == 202
    stack.wait_journal(3)
    store = stack.open_store()
    assert store.read("paused:1").fields["seq"] == [1, 2, 3]
    entry = store.journal("demo", "p-1")
    assert entry is not None
    assert entry.fence is not None
    assert entry.fence > old_token
    _audit(stack)


def paused_gone(stack: Stack, old_token: int, shard: int) -> bool:
    holder = stack.view().lease_values().get(shard, "")
    return bool(holder) and int(holder.rsplit("/", 1)[1]) > old_token


def test_redis_killed_mid_run_loses_no_acknowledged_event(
    settings: Settings, tmp_path: Path
) -> None:
    # Given a deployment on its own Redis with an fsync-always append-only file
    redis_server = EmbeddedRedis(tmp_path / "redis-data")
    url = redis_server.start()
    stack = Stack(settings.model_copy(update={"redis_url": SecretStr(url)}), tmp_path)
    try:
        for _ in range(2):
            stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned(workers=2)
        load = SequentialLoad(stack, [f"durable:{k}" for k in range(20)], per_key=60).start()
        # When Redis is killed with SIGKILL mid-run and restarted a second later
        wait_until(lambda: load.progress() > 0.3, 120, "load to get going")
        redis_server.kill()
        time.sleep(1.0)
        redis_server.start()
        # Then the senders' retries get through, and every event that got a 2xx is
        # applied exactly once, in order
        load.join()
        stack.wait_journal(load.total, timeout_s=120)
        load.verify(stack.open_store())
        assert load.retries > 0, "some deliveries were refused while Redis was down"
        _audit(stack)
    finally:
        stack.stop_all()
        redis_server.stop()


def test_extra_workers_started_at_once_never_share_a_shard(stack: Stack) -> None:
    # Given one worker under ordered load
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned(workers=1)
    load = SequentialLoad(stack, [f"burst:{k}" for k in range(30)], per_key=40).start()
    wait_until(lambda: load.progress() > 0.1, 60, "load")
    # When three more workers are started at the same moment
    starters = [threading.Thread(target=stack.worker, kwargs={"lanes": 2}) for _ in range(3)]
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    stack.wait_all_owned(workers=4)
    load.join()
    stack.wait_journal(load.total)
    # Then order holds everywhere and the lease log and journal show one owner at a time
    load.verify(stack.open_store())
    _audit(stack)
    # And the shards settle evenly over the four (a worker that lost a lease while the
    # machine was busy takes its share back within a few rebalancing rounds)

    def counts() -> list[int]:
        holders = stack.view().lease_values().values()
        return [sum(1 for h in holders if h.startswith(w)) for w in _owners(stack)]

    def even() -> bool:
        c = counts()
        return len(c) == 4 and max(c) - min(c) <= 1

    wait_until(even, 60, "shards spread evenly", on_timeout=lambda: str(counts()))


def test_a_hung_handler_gives_its_shard_up_and_the_event_applies_once(stack: Stack) -> None:
    # Given a short in-flight deadline, and a worker whose one lane hangs on stuck:1
    stack.settings = stack.settings.model_copy(
        update={"inflight_deadline_ms": 2000, "handler_time_limit_ms": 100, "store_timeout_ms": 100}
    )
    hung = stack.worker(
        lanes=1,
        faults=[
            FaultSpec(
                point="worker.before_write",
                action="sleep",
                sleep_ms=60_000,
                match="stuck:",
                times=1,
            ).model_dump()
        ],
    )
    stack.receiver()
    stack.wait_all_owned(workers=1)
    # When an event for stuck:1 arrives, its only lane hangs on it
    assert stack.post(event("s-1", "stuck:1", n={"increment": 1})).status_code == 202
    shard = stack.settings.shards.shard_for_key("stuck:1")
    wait_until(
        lambda: stack.view().client.hlen(stack.settings.keys.busy(shard)) == 1,
        10,
        "s-1 in flight",
    )
    helper = stack.worker(lanes=2)
    # Then past the deadline the hung worker gives the shard up and, every lane being
    # stuck, exits with 70; the other worker restores the event and applies it once
    wait_until(lambda: not hung.alive(), 30, "the hung worker to exit", on_timeout=hung.log)
    assert hung.process is not None
    assert hung.process.returncode == 70, hung.log()
    assert "every lane is stuck" in hung.log()
    stack.wait_journal(1, timeout_s=60)
    store = stack.open_store()
    assert store.read("stuck:1").fields == {"n": 1}
    assert helper.alive()
    _audit(stack)


def test_a_dead_workers_shards_are_owned_again_within_ttl_plus_one_heartbeat(
    stack: Stack,
) -> None:
    # Given two workers sharing the shards
    victim = stack.worker(lanes=2)
    stack.worker(lanes=2)
    stack.wait_all_owned(workers=2)
    view = stack.view()
    victim_id = next(m["worker"] for m in view.members() if m["info"].get("pid") == victim.pid)
    # When one is killed with SIGKILL
    victim.kill()
    killed_at = time.monotonic()
    # Then every shard has a live owner again within the lease TTL plus one heartbeat
    # (plus a little slack for this machine's scheduling)
    s = stack.settings
    bound_s = (s.lease_ttl_ms + s.heartbeat_ms) / 1000
    wait_until(
        lambda: (
            all(not h.startswith(victim_id) for h in view.lease_values().values())
            and len(view.lease_values()) == s.shard_count
        ),
        bound_s + 5,
        "the takeover",
    )
    elapsed = time.monotonic() - killed_at
    assert elapsed <= bound_s + 1.0, f"took {elapsed:.1f}s, bound {bound_s:.1f}s"
