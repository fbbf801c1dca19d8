"""The record, not the shard, is the unit of order and of waiting.

Real keylane processes in front of real local HTTP servers (:mod:`tests.support.notion`):
a record that waits (its destination answers 503, a debounce) holds up only itself, many
records of one shard are in flight at once, and a crash, a pause or a handoff with many of
a shard's records in flight loses, doubles and reorders nothing. Every check is exact and
driven by progress, never by timing.
"""

from __future__ import annotations

import base64
import json
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import keylane
from keylane.routing.contract.settings import Settings
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.notion import HookServer
from tests.support.stack import REPO, Stack, settings_env, wait_until
from tests.support.user_tasks import sync_page

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

APP = "tests.support.user_tasks"
HOOK_SECRET = "whsec_" + base64.b64encode(b"keylane-record-lanes-test").decode()


def _forward(
    stack: Stack, tmp_path: Path, hook: HookServer, timeout_s: int = 10, **limits: Any
) -> None:
    """Source ``shop`` forwards each order's events to ``hook`` (its record: the order)."""
    extra = "".join(f"{name} = {value!r}\n" for name, value in limits.items())
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.shop]\ndestination = "hook"\nrecord_key = "order:{body:order}"\n\n'
        f'[destinations.hook]\nkind = "http"\nurl = "{hook.url}/hook"\n'
        f'secret_env = "TEST_HOOK_SECRET"\ntimeout_s = {timeout_s}\n{extra}'
    )
    hook.secret = HOOK_SECRET
    stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
    stack.settings = stack.settings.model_copy(update={"sources_file": path})


def _orders_on(settings: Settings, shard: int, count: int, prefix: str) -> list[str]:
    """``count`` order ids whose records hash to ``shard``."""
    found, n = [], 0
    while len(found) < count:
        if settings.shards.shard_for_key(f"order:{prefix}{n}") == shard:
            found.append(f"{prefix}{n}")
        n += 1
    return found


def _orders_off(settings: Settings, shard: int, count: int, prefix: str) -> list[str]:
    """``count`` order ids whose records hash to any shard but ``shard``."""
    found, n = [], 0
    while len(found) < count:
        if settings.shards.shard_for_key(f"order:{prefix}{n}") != shard:
            found.append(f"{prefix}{n}")
        n += 1
    return found


def _send(stack: Stack, orders: list[str], per_order: int) -> None:
    """Each order's events in sequence (the next after the previous one's 2xx), the orders
    side by side."""

    def sender(order: str) -> None:
        with httpx.Client(timeout=30) as client:
            for seq in range(1, per_order + 1):
                body = {"id": f"{order}-{seq}", "order": order, "seq": seq}
                answer = stack.post(body, source="shop", client=client, retries=3)
                assert answer.status_code in (200, 202), answer.text

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(sender, orders))


def _seqs(hook: HookServer, order: str) -> list[int]:
    return [doc["seq"] for doc in hook.effects.get(f"order:{order}", [])]


def _applied(hook: HookServer, orders: list[str], per_order: int) -> bool:
    return all(len(_seqs(hook, order)) >= per_order for order in orders)


def _assert_once_in_order(hook: HookServer, orders: list[str], per_order: int) -> None:
    for order in orders:
        assert _seqs(hook, order) == list(range(1, per_order + 1)), order


@SQLITE
def test_a_record_whose_destination_fails_holds_up_only_itself(
    stack: Stack, tmp_path: Path
) -> None:
    # Given an HTTP forward whose server answers 503 for one record, order:bad, and the
    # default lanes of one worker
    hook = HookServer()
    hook.start()
    try:
        _forward(stack, tmp_path, hook, retry_for_s=600, max_backoff_s=2)
        bad_shard = stack.settings.shards.shard_for_key("order:bad")
        hook.unavailable.add("order:bad")
        stack.worker(lanes=stack.settings.lanes)
        stack.receiver()
        stack.wait_all_owned()
        # When order:bad gets 3 events, then 100 other records get 3 each, 10 of them on
        # order:bad's shard
        _send(stack, ["bad"], 3)
        mates = _orders_on(stack.settings, bad_shard, 10, "m")
        others = mates + _orders_off(stack.settings, bad_shard, 90, "o")
        _send(stack, others, 3)
        # Then every event of the others is applied, once and in order, while order:bad
        # still fails (its server answers 503 until the test says otherwise)
        wait_until(
            lambda: _applied(hook, others, 3), 120, "the other records", on_timeout=stack.logs
        )
        _assert_once_in_order(hook, others, 3)
        assert _seqs(hook, "bad") == []
        assert sum(1 for c in hook.calls if c.status == 503) >= 1
        # And status shows why it waits, how often it was tried, and what waits behind it
        shown: dict[str, Any] = {}

        def waits_in_status() -> bool:
            report = json.loads(keylane_cli(stack, "status", "--json"))
            shown.update({r["record_key"]: r for r in report["waiting_records"]})
            return "order:bad" in shown

        wait_until(waits_in_status, 30, "order:bad shown waiting")
        assert shown["order:bad"]["reason"] == "retry", shown
        assert "HTTP 503" in shown["order:bad"]["error"]
        assert shown["order:bad"]["attempts"] >= 1
        assert shown["order:bad"]["event"] == "shop/bad-1"
        assert shown["order:bad"]["behind"] == 2
        # When its server recovers, its events are applied once, in order
        hook.unavailable.clear()
        wait_until(lambda: len(_seqs(hook, "bad")) >= 3, 60, "order:bad", on_timeout=stack.logs)
        assert _seqs(hook, "bad") == [1, 2, 3]
        stack.wait_journal(3 * 101)
        assert stack.open_store().dead_letters(DeadLetterFilter()) == []
    finally:
        hook.stop()


@dataclass
class RetryHeld(HookServer):
    """Answers each record's first call 503 (it backs off), holds the first retry it gets,
    of any record, until :attr:`release` is set, and answers the other calls as usual."""

    release: threading.Event = field(default_factory=threading.Event)
    tried: set[str] = field(default_factory=set)
    held: str | None = None

    def _answer(self, headers: Any, body: bytes) -> tuple[int, Any, dict[str, str]]:
        record = headers.get("keylane-record-key") or ""
        with self.lock:
            first = record not in self.tried
            self.tried.add(record)
            hold = not first and self.held is None
            if hold:
                self.held = record
            if first:
                self._record(headers.get("idempotency-key") or "", json.loads(body), 503)
                return 503, {"error": "unavailable"}, {}
        if hold:
            self.release.wait(300)
        return super()._answer(headers, body)


@SQLITE
def test_a_wait_ends_on_its_timer_while_a_shard_mate_hangs(stack: Stack, tmp_path: Path) -> None:
    # Given two records of one shard whose first calls are answered 503 (each backs off),
    # a server that holds the first retry it gets until the test releases it, and a
    # worker that never looks at its shards unless rung or woken by a timer (no idle poll)
    hook = RetryHeld()
    hook.start()
    try:
        # (the held call does not time out while the test runs)
        _forward(stack, tmp_path, hook, timeout_s=120, retry_for_s=600, max_backoff_s=1)
        pair = _orders_on(stack.settings, 0, 2, "w")
        stack.worker(lanes=8, idle_poll_ms=3_600_000, inflight_deadline_ms=1_000_000)
        stack.receiver()
        stack.wait_all_owned()
        # When each gets one event
        _send(stack, pair, 1)
        # Then the record whose back-off ends second is called again, and its event
        # applied, while its shard-mate's retry still hangs: taking the first one did
        # not swallow the second one's wake-up
        wait_until(
            lambda: any(_seqs(hook, order) for order in pair),
            60,
            "the second record's retry",
            on_timeout=stack.logs,
        )
        held = hook.held
        assert held is not None
        assert _seqs(hook, held.removeprefix("order:")) == []
        # And once the hanging call returns, both events are applied once
        hook.release.set()
        wait_until(lambda: _applied(hook, pair, 1), 60, "both records", on_timeout=stack.logs)
        _assert_once_in_order(hook, pair, 1)
    finally:
        hook.release.set()
        hook.stop()


def _optimal_calls(times: list[float], batch: int, debounce_s: float) -> int:
    """The fewest calls a per-record debounce can make for events sent at ``times``: a
    call for up to ``batch`` events, made once the newest is ``debounce_s`` old."""
    calls, size, last = 0, 0, None
    for t in sorted(times):
        if size and (size == batch or t - last >= debounce_s):  # type: ignore[operator]
            calls, size = calls + 1, 0
        size, last = size + 1, t
    return calls + (1 if size else 0)


@SQLITE
def test_a_debounced_batch_task_calls_near_the_per_record_optimum(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a batch task (batch=20, debounce_ms=2000) posting to a webhook, 200 pages over
    # the default 64 shards
    hook = HookServer()
    hook.start()
    try:
        stack.settings = stack.settings.model_copy(update={"app": APP})
        stack.extra_env["TEST_HOOK_URL"] = f"{hook.url}/hook"
        stack.worker(lanes=stack.settings.lanes)
        stack.wait_all_owned()
        keylane.configure(redis_url=stack.settings.redis_dsn(), namespace=stack.settings.namespace)
        # When 100 events/s go to random pages for 30 s (each page's events in order)
        sent: dict[str, list[float]] = {}
        seqs: dict[str, int] = {}
        lock = threading.Lock()
        pages = [f"p{n}" for n in range(200)]
        start = time.monotonic()

        def sender(worker: int) -> None:
            rng = random.Random(worker)
            for tick in range(750):  # 4 senders x 750 = 3,000 events
                time.sleep(max(0.0, start + tick * 0.04 + worker * 0.01 - time.monotonic()))
                page = rng.choice(pages)
                with lock:  # one page's events go out in order
                    seq = seqs[page] = seqs.get(page, 0) + 1
                    sync_page.send({"page": page, "seq": seq}, event_id=f"{page}-{seq}")
                    sent.setdefault(page, []).append(time.time())

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(sender, range(4)))
        total = sum(seqs.values())
        # Then each event reaches the task once, in order
        stack.wait_journal(total, timeout_s=120)

        def items(page: str) -> list[int]:
            calls = hook.effects.get(f"page:{page}", [])
            return [item["seq"] for call in calls for item in call["items"]]

        wait_until(lambda: sum(len(items(p)) for p in seqs) >= total, 60, "every event")
        for page, count in seqs.items():
            assert items(page) == list(range(1, count + 1)), page
        # And the task is called at most 1.2 x as often as a per-record debounce must
        calls = sum(len(hook.effects.get(f"page:{p}", [])) for p in seqs)
        optimum = sum(_optimal_calls(times, 20, 2.0) for times in sent.values())
        assert calls <= 1.2 * optimum, (calls, optimum, total)
    finally:
        keylane.configure()
        hook.stop()


@POSTGRES
def test_kill_minus_nine_with_fifty_records_of_a_shard_in_flight(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a forward whose server holds every call, and 50 records of one shard, each
    # with two events
    hook = HookServer()
    hook.gate = threading.Event()
    hook.start()
    try:
        _forward(stack, tmp_path, hook)
        first = stack.worker(lanes=64)
        stack.receiver()
        stack.wait_all_owned(workers=1)
        orders = _orders_on(stack.settings, 7, 50, "k")
        _send(stack, orders, 2)
        # When the worker has all 50 records' first events in flight at once
        wait_until(lambda: hook.peak >= 50, 60, "50 calls in flight", on_timeout=stack.logs)
        assert stack.view().client.hlen(stack.settings.keys.busy(7)) == 50
        # and it is killed (-9), its calls then answered into the void
        first.kill()
        hook.gate.set()
        # Then the next owner applies every event once, in each record's order
        stack.worker(lanes=64)
        stack.wait_journal(100, timeout_s=120)
        _assert_once_in_order(hook, orders, 2)
        assert stack.open_store().dead_letters(DeadLetterFilter()) == []
    finally:
        if hook.gate is not None:
            hook.gate.set()
        hook.stop()


@POSTGRES
def test_handoff_and_a_paused_owner_with_many_records_of_a_shard_in_flight(
    stack: Stack, tmp_path: Path
) -> None:
    # Given two workers, a forward whose server holds every call, and 40 records of one
    # shard with three events each
    hook = HookServer()
    hook.gate = threading.Event()
    hook.start()
    try:
        _forward(stack, tmp_path, hook)
        workers = [stack.worker(lanes=64), stack.worker(lanes=64)]
        stack.receiver()
        stack.wait_all_owned(workers=2)
        shard = 3
        orders = _orders_on(stack.settings, shard, 40, "h")
        _send(stack, orders, 3)
        wait_until(lambda: hook.peak >= 40, 60, "40 calls in flight", on_timeout=stack.logs)
        owner = _owner_of(stack, shard, workers)
        # When the shard's owner is paused (SIGSTOP) past its lease while the calls are
        # open, and its calls are then answered
        owner.signal(signal.SIGSTOP)
        hook.gate.set()
        other = next(w for w in workers if w is not owner)
        wait_until(lambda: _owner_of(stack, shard, workers) is other, 60, "the takeover")
        # Then the other worker applies the shard's records; when the paused one wakes,
        # its late writes are refused by the fence
        stack.wait_journal(120, timeout_s=120)
        owner.signal(signal.SIGCONT)
        wait_until(lambda: "refused" in owner.log() or "lost shard" in owner.log(), 60, "refusal")
        # When the other one is stopped gracefully (SIGTERM) with more events arriving
        hook.gate.clear()
        _send(stack, orders, 4)  # the fourth event of each order (1-3 are duplicates)
        wait_until(lambda: hook.in_flight >= 40, 60, "calls in flight again")
        stopping = threading.Thread(target=_owner_of(stack, shard, workers).stop)
        stopping.start()
        hook.gate.set()
        stopping.join(60)
        # Then every event is applied once, in each record's order
        stack.wait_journal(160, timeout_s=120)
        _assert_once_in_order(hook, orders, 4)
        assert stack.open_store().dead_letters(DeadLetterFilter()) == []
    finally:
        if hook.gate is not None:
            hook.gate.set()
        hook.stop()


def _owner_of(stack: Stack, shard: int, workers: list[Any]) -> Any:
    holder = stack.view().lease_values().get(shard, "")
    pid = holder.split(":")[1] if holder.count(":") >= 2 else ""
    return next((w for w in workers if str(w.pid) == pid), None)


def keylane_cli(stack: Stack, *args: str) -> str:
    """Run a ``keylane`` command against the test deployment; its standard output."""
    done = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *args],
        env={**settings_env(stack.settings), **stack.extra_env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
