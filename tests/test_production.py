"""Running it in production: backpressure to senders, metrics, health checks, structured
logs, and a rolling restart under load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from keylane.ops.audit import audit_journal, audit_lease_log
from keylane.routing.contract.settings import FaultSpec
from tests.support.load import SequentialLoad
from tests.support.services import free_port
from tests.support.stack import REPO, Stack, event, settings_env, wait_until

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
# Several worker processes at once: SQLite takes one writer process.
POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _value(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


@SQLITE
def test_a_slow_destination_pushes_back_on_senders_and_nothing_is_lost(stack: Stack) -> None:
    # Given a destination that takes 20 ms per write, one event per write, and a high-water
    # mark of 40 per shard
    stack.settings = stack.settings.model_copy(update={"shard_high_water": 40, "batch_max": 1})
    stack.settings.faults.append(
        FaultSpec(point="worker.before_write", action="sleep", sleep_ms=20)
    )
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    keys = [f"slow:{k}" for k in range(3)]
    shards = {stack.settings.shards.shard_for_key(k) for k in keys}
    # When 10 senders per key deliver faster than it drains, retrying as Retry-After says
    load = SequentialLoad(stack, keys, per_key=30, honour_retry_after=True)
    depths: list[int] = []
    watcher_stop = threading.Event()

    def watch_depth() -> None:
        view = stack.view()
        while not watcher_stop.is_set():
            depths.append(max(view.depth(s) for s in shards))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_depth)
    watcher.start()
    extra = [
        SequentialLoad(stack, keys, per_key=30, prefix=f"burst{n}", honour_retry_after=True)
        for n in range(9)
    ]
    for each in [load, *extra]:
        each.start()
    try:
        for each in [load, *extra]:
            each.join()
    finally:
        watcher_stop.set()
        watcher.join()
    # Then senders were refused with 503 and a Retry-After, and no queue grew past its mark
    refusals = [r for each in [load, *extra] for r in each.refusals]
    assert any(status == 503 and error == "shard_full" for status, error, _ in refusals)
    assert all(
        after is not None and int(after) >= 1 for status, _, after in refusals if status == 503
    )
    assert max(depths) <= 40
    # And after the retries every event was applied exactly once
    total = sum(each.total for each in [load, *extra])
    stack.wait_journal(total, timeout_s=180)
    store = stack.open_store()
    assert store.journal_size() == total
    for key in keys:
        fields = store.read(key).fields
        assert len(fields["seq"]) == 300
        assert fields["total"] == 10 * sum(range(1, 31))
    refused = _value(_metrics(stack.ops_url), "keylane_refused_total", reason="shard_full")
    assert refused == sum(1 for s, e, _ in refusals if e == "shard_full")


@SQLITE
def test_over_the_global_high_water_mark_every_shard_refuses(stack: Stack) -> None:
    # Given a global mark of 20 events, one source, and no worker draining
    stack.settings = stack.settings.model_copy(update={"global_high_water": 20})
    stack.receiver()
    for n in range(20):
        assert stack.post(event(f"g-{n}", f"global:{n}", a={"set": n})).status_code == 202
    # When one more comes, for any key: it is refused, with when to come back
    for key in ("global:new", "global:other"):
        answer = stack.post(event(f"g-{key}", key, a={"set": 1}))
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "overloaded"
        assert int(answer.headers["retry-after"]) >= 1
    # And once a worker drains the queues, deliveries are accepted again
    stack.worker(lanes=2)
    wait_until(
        lambda: stack.post(event("g-z", "global:later", a={"set": 1})).status_code == 202,
        30,
        "acceptance after draining",
    )


@SQLITE
def test_metrics_match_what_was_sent(stack: Stack) -> None:
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    # When 200 events (20 of them sent twice), 10 bad bodies and 5 keyless events arrive
    for n in range(200):
        assert (
            stack.post(event(f"m-{n}", f"metric:{n % 10}", n={"increment": 1})).status_code == 202
        )
        if n % 10 == 0:
            assert (
                stack.post(event(f"m-{n}", f"metric:{n % 10}", n={"increment": 1})).status_code
                == 200
            )
        if n == 100:  # scraped during the load: it answers (the counts within a flush)
            wait_until(
                lambda: _value(_metrics(stack.ops_url), "keylane_accepted_total") >= 100,
                30,
                "the accepts counted",
            )
    for _ in range(10):
        assert stack.post(b"{broken").status_code == 400
    for n in range(5):
        body = {"type": "t", "record_key": "metric:keyless", "changes": {"k": {"append": n}}}
        assert stack.post(body).status_code == 202
    stack.wait_journal(205)
    wait_until(
        lambda: _value(_metrics(stack.ops_url), "keylane_applied_total") == 205,
        20,
        "the counters to settle",
    )
    stack.settled_counters()  # and the receiver's written too
    # Then the metrics say exactly that
    m = _metrics(stack.ops_url)
    assert _value(m, "keylane_accepted_total") == 205
    assert _value(m, "keylane_duplicate_deliveries_total") == 20
    assert _value(m, "keylane_keyless_total") == 5
    assert _value(m, "keylane_refused_total", reason="malformed_json") == 10
    assert "_created" not in m  # no series of prometheus_client's own beside the counters
    assert _value(m, "keylane_applied_total") == 205
    assert _value(m, "keylane_dead_letters_total") == 0
    assert _value(m, "keylane_attempts_total") >= 205
    assert _value(m, "keylane_apply_latency_seconds_count") == 205
    assert _value(m, "keylane_apply_latency_seconds_bucket", le="+Inf") == 205
    assert _value(m, "keylane_workers") == 1
    depth_series = [k for k in m if k[0] == "keylane_queue_depth"]
    assert len(depth_series) == stack.settings.shard_count

    def drained() -> bool:  # the receiver reads depths once a second
        m = _metrics(stack.ops_url)
        return all(v == 0 for k, v in m.items() if k[0] == "keylane_queue_depth")

    wait_until(drained, 10, "the depths to read 0")


@SQLITE
def test_health_check_exit_codes(stack: Stack) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keylane.ops.cli", "check", *args],
            env=settings_env(stack.settings),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # Given no worker: unhealthy (no shard has an owner)
    stack.receiver()
    down = check("--receiver", stack.url)
    assert down.returncode == 1
    assert "FAIL shards" in down.stdout
    # Given a worker: healthy, receiver included
    stack.worker(lanes=2)
    stack.wait_all_owned()
    up = check("--receiver", stack.url)
    assert up.returncode == 0, up.stdout
    assert [line.split()[1] for line in up.stdout.splitlines()] == [
        "redis",
        "store",
        "shards",
        "receiver",
    ]
    # And a receiver that does not answer is a failure
    assert check("--receiver", f"http://127.0.0.1:{free_port()}").returncode == 1


@SQLITE
def test_log_lines_about_an_event_say_which_event(stack: Stack) -> None:
    # Given a worker logging JSON lines
    stack.extra_env["KEYLANE_LOG_FORMAT"] = "json"
    worker = stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    # When an event becomes a dead letter (an increment of a text field)
    assert stack.post(event("l-1", "logged:1", a={"set": "text"})).status_code == 202
    assert stack.post(event("l-2", "logged:1", a={"increment": 1})).status_code == 202
    wait_until(lambda: "dead letter" in worker.log(), 20, "the dead letter's log line")
    # Then that line carries the event id, record key, shard and attempt
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    line = next(entry for entry in lines if "dead letter" in entry["message"])
    assert line["event_id"] == "l-2"
    assert line["record_key"] == "logged:1"
    assert line["shard"] == stack.settings.shards.shard_for_key("logged:1")
    assert line["attempt"] == 1
    assert line["source"] == "demo"


@POSTGRES
def test_rolling_restart_under_load_loses_and_duplicates_nothing(stack: Stack) -> None:
    # Given two receivers and three workers under ordered load that fails over between
    # the receivers
    ports = [free_port(), free_port()]
    receivers = [stack.receiver(port=p) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    workers = [stack.worker(lanes=2) for _ in range(3)]
    stack.wait_all_owned(workers=3)
    load = SequentialLoad(stack, [f"roll:{k}" for k in range(30)], per_key=60, urls=urls).start()
    # When each receiver, then each worker, is stopped with SIGTERM and started again
    for n, receiver in enumerate(receivers):
        wait_until(lambda n=n: load.progress() > 0.1 + 0.1 * n, 120, "load")
        assert receiver.stop() == 0
        stack.receiver(port=ports[n])
    for n, worker in enumerate(workers):
        wait_until(lambda n=n: load.progress() > 0.35 + 0.15 * n, 120, "load")
        assert worker.stop() == 0, worker.log()[-2000:]
        stack.worker(lanes=2)
    load.join()
    stack.wait_journal(load.total, timeout_s=120)
    # Then every event was applied once and in order, and shards changed hands cleanly
    load.verify(stack.open_store())
    assert audit_lease_log(stack.view().lease_events()) == []
    assert audit_journal(stack.open_store().journal_entries()) == []
