"""Writing where the records live: user tasks and HTTP forwards, with real keylane
processes in front of real local HTTP servers (:mod:`tests.support.notion`).

Each scenario ends with exact checks: one page (one effect) per contact (event id), every
update present, in send order, nothing lost."""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import keylane
from keylane.routing.contract.settings import Settings
from keylane.workers.store_rows import DeadLetter, DeadLetterFilter
from tests.support.notion import HookServer, NotionLike
from tests.support.stack import REPO, Stack, settings_env, wait_until
from tests.support.user_tasks import post_to_hook, search_then_create

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

APP = "tests.support.user_tasks"

#: One contact's deliveries: for each update in order, how many copies are sent at once.
Plan = dict[str, list[int]]


def _configure(stack: Stack, tmp_path: Path, sources: str, **settings: Any) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(sources)
    stack.settings = stack.settings.model_copy(
        update={"sources_file": path, "app": APP, **settings}
    )


def _plan(contacts: int, seed: int) -> Plan:
    """2-5 deliveries per contact: 1-3 different updates, the rest identical retries."""
    rng = random.Random(seed)
    plan: Plan = {}
    for n in range(contacts):
        deliveries = rng.randint(2, 5)
        updates = rng.randint(1, min(3, deliveries))
        copies = [1] * updates
        for _ in range(deliveries - updates):
            copies[rng.randrange(updates)] += 1
        plan[f"c{n}@example.com"] = copies
    return plan


def _run_plan(plan: Plan, deliver: Callable[[httpx.Client, dict[str, Any]], None]) -> None:
    """Every contact at once; within a contact, each update's copies at once, and the next
    update after the previous one was answered (so send order is well defined). Each
    sending thread has its own HTTP client, as separate senders do."""
    local, clients = threading.local(), []

    def send(payload: dict[str, Any]) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=30)
            clients.append(local.client)
        deliver(local.client, payload)

    def contact(email: str) -> None:
        for seq, copies in enumerate(plan[email], 1):
            payload = {"id": f"{email}/{seq}", "email": email, "seq": seq}
            for copy in [senders.submit(send, payload) for _ in range(copies)]:
                copy.result()

    try:
        with ThreadPoolExecutor(200) as senders, ThreadPoolExecutor(50) as contacts:
            list(contacts.map(contact, plan))
    finally:
        for client in clients:
            client.close()


def _duplicates(crm: NotionLike) -> int:
    return sum(len(pages) - 1 for pages in crm.pages_by_email().values())


@SQLITE
def test_search_then_create_makes_one_page_per_contact_behind_keylane(
    stack: Stack, tmp_path: Path
) -> None:
    plan = _plan(200, seed=12)
    events = sum(len(copies) for copies in plan.values())
    # Given a Notion-like API with no unique constraint and 5-50 ms per call
    direct_crm, crm = NotionLike(seed=1).start(), NotionLike(seed=2).start()
    try:
        # When the workload goes straight at it from a thread pool
        _run_plan(plan, lambda client, p: search_then_create(client, direct_crm.url, p))
        direct = _duplicates(direct_crm)
        # And the same workload goes through keylane: a source whose task searches, then
        # creates or appends
        _configure(
            stack,
            tmp_path,
            '[sources.crm]\ntask = "sync_contact"\nrecord_key = "contact:{body:email}"\n',
        )
        stack.extra_env["TEST_CRM_URL"] = crm.url
        stack.worker(lanes=16)
        stack.receiver()
        stack.wait_all_owned()
        _run_plan(plan, lambda client, p: _post_ok(stack, client, p))
        stack.wait_journal(events)
        pages = crm.pages_by_email()
        print(
            f"\nrace: {len(plan)} contacts, {sum(map(sum, plan.values()))} deliveries; "
            f"duplicate pages straight from a thread pool: {direct}, behind keylane: "
            f"{_duplicates(crm)}"
        )
        # Then keylane made exactly one page per contact, holding every update in order
        assert {email: len(p) for email, p in pages.items()} == dict.fromkeys(plan, 1)
        for email, copies in plan.items():
            assert pages[email][0]["updates"] == list(range(1, len(copies) + 1)), email
        # While the thread pool made duplicates of the same workload
        assert direct > 0
        assert stack.open_store().journal_size() == events
    finally:
        direct_crm.stop()
        crm.stop()


def _post_ok(stack: Stack, client: httpx.Client, payload: dict[str, Any]) -> None:
    answer = stack.post(payload, source="crm", client=client, retries=3)
    assert answer.status_code in (200, 202), answer.text


HOOK_SECRET = "whsec_" + base64.b64encode(b"keylane-test-hook-secret").decode()


def _forward_sources(url: str, timeout_s: float = 10, **limits: Any) -> str:
    extra = "".join(f"{name} = {value!r}\n" for name, value in limits.items())
    return (
        '[sources.shop]\ndestination = "hook"\nrecord_key = "order:{body:order}"\n\n'
        f'[destinations.hook]\nkind = "http"\nurl = "{url}/hook"\n'
        f'secret_env = "TEST_HOOK_SECRET"\ntimeout_s = {timeout_s}\n{extra}'
    )


def _send_orders(stack: Stack, orders: int, per_order: int) -> None:
    """One sender per order, each event after the previous one's 2xx."""

    def sender(n: int) -> None:
        with httpx.Client(timeout=30) as client:
            for seq in range(1, per_order + 1):
                body = {"id": f"o{n}-{seq}", "order": f"o{n}", "seq": seq}
                _ok(stack.post(body, source="shop", client=client, retries=3))

    with ThreadPoolExecutor(orders) as pool:
        list(pool.map(sender, range(orders)))


def _ok(answer: httpx.Response) -> None:
    assert answer.status_code in (200, 202), answer.text


def _assert_each_once_in_order(hook: HookServer, orders: int, per_order: int) -> None:
    for n in range(orders):
        seqs = [doc["seq"] for doc in hook.effects.get(f"order:o{n}", [])]
        assert seqs == list(range(1, per_order + 1)), (n, seqs)


@POSTGRES
def test_a_worker_killed_mid_call_repeats_it_with_the_same_idempotency_key(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a signed HTTP forward to a server that honours Idempotency-Key, two workers
    hook = HookServer(secret=HOOK_SECRET)
    hook.start()
    held = "shop/o3-2"
    hook.hold[held] = threading.Event()
    try:
        _configure(stack, tmp_path, _forward_sources(hook.url))
        stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
        workers = [stack.worker(), stack.worker()]
        stack.receiver()
        stack.wait_all_owned(workers=2)
        # When 8 orders send 5 events each, and the call for o3-2 is held at the server
        sending = threading.Thread(target=_send_orders, args=(stack, 8, 5))
        sending.start()
        wait_until(lambda: any(c.key == held for c in hook.calls), 60, "the held call")
        # And the worker making that call is killed in the middle of it
        shard = stack.settings.shards.shard_for_key("order:o3")
        owner = stack.view().lease_values()[shard].rsplit("/", 1)[0]
        victim = next(w for w in workers if owner.split(":")[1] == str(w.pid))
        victim.kill()
        hook.hold[held].set()
        sending.join()
        stack.wait_journal(40, timeout_s=120)
    finally:
        hook.hold[held].set()
        hook.stop()
    # Then the call was made again with the same key, and had one effect
    calls = [c for c in hook.calls if c.key == held and c.status]
    assert len(calls) >= 2, calls
    assert {c.body["id"] for c in calls} == {"o3-2"}
    # And every event of every order had exactly one effect, in order
    _assert_each_once_in_order(hook, 8, 5)
    assert len(hook.answers) == 40


@POSTGRES
def test_a_429_storm_loses_nothing_reorders_nothing_and_the_rate_holds_across_workers(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a server that answers 429 + Retry-After to everything for 2 s after the first
    # call and to every 10th call after that, behind a destination allowed 8 calls/s
    rate = 8
    hook = HookServer(secret=HOOK_SECRET, storm_s=2.0, storm_every=10, retry_after_s=1)
    hook.start()
    try:
        _configure(stack, tmp_path, _forward_sources(hook.url, rate_per_s=rate, max_in_flight=3))
        stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
        stack.worker()
        stack.worker()
        stack.receiver()
        stack.wait_all_owned(workers=2)
        # When 10 orders send 5 events each
        _send_orders(stack, 10, 5)
        stack.wait_journal(50, timeout_s=120)
    finally:
        hook.stop()
    busiest = hook.max_calls_in_window(1.0)
    print(
        f"\n429 storm: {sum(hook.status_counts.values())} calls ({hook.status_counts}); "
        f"most calls seen by the server in any 1 s: {busiest} (configured {rate}/s)"
    )
    # Then nothing was lost or reordered, and each event had one effect
    _assert_each_once_in_order(hook, 10, 5)
    assert hook.status_counts.get(429, 0) > 5
    # And the server never saw more than the rate (plus the bucket's one token of burst)
    assert busiest <= rate + 1
    assert not stack.open_store().dead_letters(DeadLetterFilter())
    # And keylane status and /metrics show the destination's flow control
    status = json.loads(keylane_cli(stack, "status", "--json").stdout)
    (hook_status,) = status["destinations"]
    assert hook_status["destination"] == "hook"
    assert hook_status["rate_per_s"] == rate
    assert hook_status["max_in_flight"] == 3
    assert hook_status["in_flight"] == 0
    assert hook_status["done"] == 50
    assert hook_status["calls"] == sum(hook.status_counts.values())
    metrics = httpx.get(f"{stack.ops_url}/metrics").text
    assert f'keylane_destination_rate_limit{{destination="hook"}} {float(rate)}' in metrics
    assert 'keylane_destination_calls_total{destination="hook",outcome="done"} 50.0' in metrics
    # And the outcomes are only outcomes: they add up to the calls made, counted once
    outcomes = re.findall(
        r'keylane_destination_calls_total\{destination="hook",outcome="(\w+)"\} (\S+)', metrics
    )
    assert {name for name, _ in outcomes} == {"done", "retried", "gave_up", "conflicts", "failed"}
    assert sum(float(v) for _, v in outcomes) == hook_status["calls"]
    assert "_created" not in metrics
    # And no worker logged a line per call (httpx's INFO lines are left out)
    assert not any(" INFO httpx " in proc.log() for proc in stack.procs)


@SQLITE
def test_one_process_keeps_many_records_in_flight_on_two_threads(
    stack: Stack, tmp_path: Path
) -> None:
    # Given an HTTP destination that holds every call until 48 calls are open at once
    # (up to 60 s: the calls' timeout is longer, so no call is given up and sent again
    # while the server still holds it, however slowly a busy machine gathers them; the
    # in-flight deadline grows with it, as the settings check demands)
    hook = HookServer(secret=HOOK_SECRET, gather=48)
    hook.start()
    try:
        sources = _forward_sources(hook.url, timeout_s=90)
        _configure(stack, tmp_path, sources, lane_threads=2, inflight_deadline_ms=600_000)
        stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
        # And one worker process with 64 lanes and two threads for blocking calls
        worker = stack.worker(lanes=64)
        stack.receiver()
        stack.wait_all_owned()
        # When 200 orders send 2 events each
        _send_orders(stack, 200, 2)
        stack.wait_journal(400, timeout_s=120)
        assert worker.process is not None
        threads = _threads_of_tree(worker.process.pid)
    finally:
        hook.stop()
    # Then the destination saw 48 calls open at once from that one process, which runs
    # far fewer threads than that: a lane waiting for an answer holds no thread
    assert hook.peak >= 48
    assert threads < 32, threads
    # And never two calls for one record at once; each event once, in order
    assert hook.overlaps == 0
    _assert_each_once_in_order(hook, 200, 2)
    assert not stack.open_store().dead_letters(DeadLetterFilter())


def _threads_of_tree(pid: int) -> int:
    """Threads of process ``pid`` and of its descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(len(list(Path(f"/proc/{p}/task").glob("*"))) for p in tree)


def _keys_on_other_shards(settings: Settings, prefix: str, taken: set[int], n: int) -> list[str]:
    """``n`` record keys whose shards are not in ``taken``: a shard is the unit of order,
    so a waiting record holds up the records that share its shard (README)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if settings.shards.shard_for_key(f"item:{key}") not in taken:
            out.append(key)
        i += 1
    return out


@SQLITE
def test_a_destination_down_for_30s_waits_in_place_while_others_flow(
    stack: Stack, tmp_path: Path
) -> None:
    # Given an HTTP forward (source shop) and a Python task posting to another service
    down, other = HookServer(), HookServer()
    down.start()
    other.start()
    down.refuse.add("o9-1")
    try:
        _configure(
            stack,
            tmp_path,
            _forward_sources(down.url, retry_for_s=120, max_backoff_s=4),
            max_deliveries=3,
        )
        stack.extra_env.update(TEST_HOOK_SECRET=HOOK_SECRET, TEST_HOOK_URL=f"{other.url}/hook")
        stack.worker()
        stack.receiver()
        stack.wait_all_owned()
        # When the forward refuses an event (422): it is a dead letter with the answer
        _ok(stack.post({"id": "o9-1", "order": "o9", "seq": 1}, source="shop"))
        row = _one_dead_letter(stack)
        assert row.reason == "rejected"
        assert "HTTP 422" in row.error
        assert '"refused"' in row.error
        shown = keylane_cli(stack, "dlq", "show", str(row.id))
        assert "HTTP 422" in shown.stdout, shown.stdout + shown.stderr
        # When the forward's server goes down for 30 s while both get events
        down.stop()
        went_down, calls_before = time.monotonic(), len(down.calls)
        _send_orders(stack, 5, 4)
        order_shards = {stack.settings.shards.shard_for_key(f"order:o{n}") for n in range(5)}
        items = _keys_on_other_shards(stack.settings, "i", order_shards, 10)
        sent = _send_items(stack, items, 3)
        # Then the other service gets all of its events (each once) while the first is down
        wait_until(lambda: sum(map(len, other.effects.values())) == 30, 60, "the other events")
        assert sent.count("duplicate") == 10
        assert sent.count("accepted") == 30
        assert len(down.calls) == calls_before
        # And nothing of the down destination is dead-lettered meanwhile
        assert len(stack.open_store().dead_letters(DeadLetterFilter())) == 1
        time.sleep(max(0.0, 30 - (time.monotonic() - went_down)))  # the outage itself
        down.refuse.clear()
        down.start()
        # When it is back, every event arrives once, in order
        stack.wait_journal(1 + 20 + 30, timeout_s=60)
        _assert_each_once_in_order(down, 5, 4)
        # And the dead letter, retried, goes through the record's lane once
        retried = keylane_cli(stack, "dlq", "retry", str(row.id), "--yes")
        assert retried.returncode == 0, retried.stderr
        wait_until(lambda: down.effects.get("order:o9"), 30, "the retried event")
    finally:
        down.stop()
        other.stop()
    assert [d["seq"] for d in down.effects["order:o9"]] == [1]
    for item in items:
        assert [d["n"] for d in other.effects[f"item:{item}"]] == [1, 2, 3]


def _send_items(stack: Stack, items: list[str], per_item: int) -> list[str]:
    """Send events to the ``post_to_hook`` task from Python, each one twice."""
    keylane.configure(redis_url=stack.settings.redis_dsn(), namespace=stack.settings.namespace)
    statuses = []
    for n in range(1, per_item + 1):
        for item in items:
            for copy in range(2 if n == 1 else 1):
                sent = post_to_hook.send({"item": item, "n": n}, event_id=f"{item}-{n}")
                statuses.append(sent.status)
                assert copy == 0 or sent.status == "duplicate"
    keylane.configure()
    return statuses


def _one_dead_letter(stack: Stack) -> DeadLetter:
    store = stack.open_store()
    wait_until(lambda: store.dead_letters(DeadLetterFilter()), 30, "a dead letter", stack.logs)
    return store.dead_letters(DeadLetterFilter())[0]


def keylane_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``keylane`` command against the test deployment."""
    return subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *args],
        env={**settings_env(stack.settings), **stack.extra_env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@SQLITE
@pytest.mark.parametrize(
    ("app", "sources", "error"),
    [
        ("no_such_module", "", "cannot import the app module 'no_such_module'"),
        (APP, '[sources.a]\ntask = "nope"\nrecord_key = "k:{body:id}"\n', "no task named 'nope'"),
        (APP, _forward_sources("ftp://example.com"), "url must be http:// or https://"),
        (APP, _forward_sources("http://127.0.0.1:9"), "TEST_HOOK_SECRET not set"),
    ],
)
def test_a_worker_refuses_to_start_with_a_task_or_destination_that_cannot_work(
    stack: Stack, tmp_path: Path, app: str, sources: str, error: str
) -> None:
    # Given an app module or a sources file that cannot work
    path = tmp_path / "sources.toml"
    path.write_text(sources or "[sources.demo]\n")
    stack.settings = stack.settings.model_copy(update={"sources_file": path})
    # When a worker starts with it
    result = keylane_cli(stack, "worker", "-A", app)
    # Then it stops at once with exit code 2, saying what is wrong
    assert result.returncode == 2, result.stderr
    assert error in result.stderr


@SQLITE
def test_dlq_show_of_a_task_and_a_forward_shows_payload_answer_and_attempts(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a forward whose destination refuses o1-1 (422), and a task that refuses an
    # unknown plan and fails twice before it syncs another contact
    hook = HookServer(secret=HOOK_SECRET, refuse={"o1-1"})
    hook.start()
    try:
        sources = _forward_sources(hook.url) + (
            '\n[sources.signup]\ntask = "flaky_signup"\nrecord_key = "signup:{body:email}"\n'
        )
        _configure(stack, tmp_path, sources)
        stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
        worker = stack.worker()
        stack.receiver()
        stack.wait_all_owned()
        _ok(stack.post({"id": "o1-1", "order": "o1", "seq": 1}, source="shop"))
        _ok(stack.post({"id": "s1", "email": "a@x", "plan": "unknown"}, source="signup"))
        _ok(stack.post({"id": "s2", "email": "b@x", "fail_first": 2}, source="signup"))
        stack.wait_journal(3)
    finally:
        hook.stop()
    rows = {r.event_id: r for r in stack.open_store().dead_letters(DeadLetterFilter())}
    assert set(rows) == {"o1-1", "s1"}
    # When `dlq show` shows the forward's dead letter
    forward = keylane_cli(stack, "dlq", "show", str(rows["o1-1"].id)).stdout
    # Then it shows where it went, the answer that came back, the attempts, the payload;
    # no revisions and no table of fields (a forward has no change)
    assert "reason: rejected" in forward
    assert "sent to     hook" in forward
    assert "HTTP 422" in forward
    assert '"refused"' in forward
    assert "attempts    1" in forward
    assert 'payload:\n  {\n    "id": "o1-1",\n    "order": "o1",\n    "seq": 1\n  }' in forward
    assert "revisions" not in forward
    assert "ATTEMPTED CHANGE" not in forward
    # And the same for the task's
    task = keylane_cli(stack, "dlq", "show", str(rows["s1"].id)).stdout
    assert "reason: gave_up" in task
    assert "the CRM does not know the plan 'unknown'" in task
    assert '"plan": "unknown"' in task
    assert "revisions" not in task
    assert "ATTEMPTED CHANGE" not in task
    # And the task's own log line says the attempt its context field says
    synced = next(line for line in worker.log().splitlines() if "synced (attempt" in line)
    assert "synced (attempt 3)" in synced, synced
    assert "attempt=3" in synced, synced


@SQLITE
def test_status_shows_what_is_stuck_first_and_every_outcome(stack: Stack, tmp_path: Path) -> None:
    # Given a task that gives up on an unknown plan, and one contact it keeps retrying
    _configure(
        stack,
        tmp_path,
        '[sources.signup]\ntask = "flaky_signup"\nrecord_key = "signup:{body:email}"\n',
    )
    stack.worker()
    stack.receiver()
    stack.wait_all_owned()
    _ok(stack.post({"id": "s1", "email": "a@x", "plan": "unknown"}, source="signup"))
    stack.wait_journal(1)
    _ok(stack.post({"id": "s2", "email": "c@x", "fail_first": 10**6}, source="signup"))
    _ok(stack.post({"id": "s3", "email": "c@x"}, source="signup"))
    shard = stack.settings.shards.shard_for_key("signup:c@x")
    # When the contact has been retrying in place for more than a second (it waits between
    # its calls: status shows it waiting, at the head of its record)
    seen: list[str] = []

    def retrying_for_a_while() -> bool:
        if _retried(stack) < 3 or _oldest_s(stack, shard) <= 1.5:
            return False
        seen[:] = [keylane_cli(stack, "status", "--stuck-after", "1s").stdout]
        return any(line.split()[2:3] == ["waiting"] for line in _record_rows(seen[0]))

    wait_until(retrying_for_a_while, 60, "the contact to retry for a while", on_timeout=stack.logs)
    text = seen[0]
    lines = text.splitlines()
    # Then its shard comes first, stuck, with how old its oldest event is
    header = next(n for n, line in enumerate(lines) if line.startswith("SHARD"))
    row = lines[header + 1].split()
    assert row[:2] == [str(shard), "stuck"], text
    assert float(row[5]) > 1.0, text  # OLDEST_S: the event retrying in place
    assert row[4] == "2", text  # s2 and s3, neither done yet
    # And the record waiting: its event, why, how often tried, and s3 behind it
    record = _record_rows(text)[0].split()
    assert record[2:4] == ["waiting", "signup/s2"], text
    assert record[5] == "retry", text
    assert int(record[6]) >= 1, text
    assert record[8] == "1", text
    # And one line for every idle shard
    assert f"idle: {stack.settings.shard_count - 1} shard(s)" in text
    # And every outcome of the destination's calls, the gave-up one among them
    columns = next(line for line in lines if line.startswith("DESTINATION")).split()
    for name in ("CALLS", "DONE", "RETRIED", "GAVE_UP", "CONFLICTS", "FAILED", "WAITS"):
        assert name in columns, columns
    values = next(line for line in lines if line.startswith("task:flaky_signup")).split()
    by_column = dict(zip(columns, values, strict=True))
    assert by_column["GAVE_UP"] == "1", text
    assert int(by_column["RETRIED"]) >= 3, text
    # And the counters
    assert "counters: " in text
    assert "dead_lettered 1" in text


def _record_rows(status_text: str) -> list[str]:
    """The rows of the waiting records' table of ``keylane status``."""
    return [line for line in status_text.splitlines() if line.startswith("signup:c@x ")]


def _retried(stack: Stack) -> int:
    status = json.loads(keylane_cli(stack, "status", "--json").stdout)
    return sum(d.get("retried", 0) for d in status["destinations"])


def _oldest_s(stack: Stack, shard: int) -> float:
    status = json.loads(keylane_cli(stack, "status", "--json").stdout)
    return float(status["shards"][shard]["oldest_age_s"] or 0)
