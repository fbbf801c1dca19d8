"""Batch tasks: a task registered with ``batch=N`` is called once for a record's waiting
events (up to N, in order), and with ``debounce_ms`` only once the record's newest event is
that old. Real worker and receiver processes, real Redis, a real local HTTP server that
records every call (:class:`tests.support.notion.HookServer`); each scenario ends with the
exact items every record received, in order, each once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import keylane
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.notion import HookServer
from tests.support.stack import Stack, wait_until
from tests.support.user_tasks import save_draft, sync_list

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

APP = "tests.support.user_tasks"
LISTS_SOURCE = '[sources.lists]\ntask = "sync_list"\nbatch = 10\nrecord_key = "list:{body:list}"\n'


def _start(stack: Stack, tmp_path: Path, hook: HookServer, **env: str) -> None:
    path = tmp_path / "sources.toml"
    path.write_text(LISTS_SOURCE)
    stack.settings = stack.settings.model_copy(update={"sources_file": path, "app": APP})
    stack.extra_env.update({"TEST_HOOK_URL": f"{hook.url}/hook", **env})


def _send(
    task: keylane.Task, stack: Stack, field: str, record: str, count: int
) -> tuple[float, float]:
    """``count`` events of one record from Python, in order; when the last send began and
    when it returned (its event was accepted in between, and a debounce counts from the
    acceptance: on a busy machine a send may return a few hundred ms after it)."""
    keylane.configure(redis_url=stack.settings.redis_dsn(), namespace=stack.settings.namespace)
    try:
        began = time.time()
        for n in range(count):
            began = time.time()
            assert task.send({field: record, "n": n}, event_id=f"{record}-{n}").status == (
                "accepted"
            )
        return began, time.time()
    finally:
        keylane.configure()


def _items(hook: HookServer) -> dict[str, list[int]]:
    """Per record, the items of its successful calls, in the order the calls came."""
    return {
        record: [item["n"] for doc in docs for item in doc["items"]]
        for record, docs in hook.effects.items()
    }


def _sizes(hook: HookServer, record: str) -> list[int]:
    return [len(doc["items"]) for doc in hook.effects.get(record, [])]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
def test_a_batch_task_gets_a_records_waiting_events_in_one_call_each_once_in_order(
    stack: Stack, tmp_path: Path
) -> None:
    hook = HookServer().start()
    try:
        _start(stack, tmp_path, hook)
        # Given 45 events of list a sent from Python, and 7 of list c through the receiver
        # (a source naming the task, batch = 10), all waiting before any worker runs
        stack.receiver()
        _send(sync_list, stack, "list", "a", 45)
        for n in range(7):
            body: dict[str, Any] = {"id": f"c-{n}", "list": "c", "n": n}
            assert stack.post(body, source="lists").status_code == 202
        # When a worker starts
        stack.worker(lanes=8)
        stack.wait_all_owned()
        stack.wait_journal(52)
        # Then each list got every event once, in order, in calls of at most 10 events
        assert _items(hook) == {"list:a": list(range(45)), "list:c": list(range(7))}
        assert _sizes(hook, "list:a") == [10, 10, 10, 10, 5]
        assert _sizes(hook, "list:c") == [7]
        # And each call carried an idempotency key of its own
        keys = [call.key for call in hook.calls]
        assert len(set(keys)) == len(keys) == 6
        entries = stack.open_store().journal_entries("list:a")
        assert {e.outcome for e in entries} == {"applied"}
        assert len(entries) == 45
    finally:
        hook.stop()


@SQLITE
def test_a_batch_that_must_wait_is_taken_together_again(stack: Stack, tmp_path: Path) -> None:
    # Given a destination that answers 429 to every call in its first 1.5 seconds
    hook = HookServer(storm_s=1.5).start()
    try:
        _start(stack, tmp_path, hook)
        _send(sync_list, stack, "list", "a", 45)
        # When a worker works through list a's 45 waiting events
        stack.worker()
        stack.wait_all_owned()
        stack.wait_journal(45)
        # Then the batches waited out the storm whole: the calls that went through carried
        # the same batches as without it, each event once, in order
        assert hook.status_counts.get(429, 0) > 0
        assert _items(hook) == {"list:a": list(range(45))}
        assert _sizes(hook, "list:a") == [10, 10, 10, 10, 5]
    finally:
        hook.stop()


@SQLITE
def test_a_batch_the_task_gives_up_on_is_a_dead_letter_per_event(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a destination that refuses the call whose first event is a-10
    hook = HookServer(refuse={"a-10"}).start()
    try:
        _start(stack, tmp_path, hook)
        _send(sync_list, stack, "list", "a", 45)
        # When a worker works through them
        stack.worker()
        stack.wait_all_owned()
        stack.wait_journal(45)
        # Then the refused call's ten events are each a dead letter saying why, and the
        # rest went through in order
        rows = stack.open_store().dead_letters(DeadLetterFilter())
        assert sorted(row.event_id for row in rows) == sorted(f"a-{n}" for n in range(10, 20))
        assert {row.reason for row in rows} == {"gave_up"}
        assert all("one call for 10 events" in row.error for row in rows)
        assert _items(hook) == {"list:a": [*range(10), *range(20, 45)]}
    finally:
        hook.stop()


@SQLITE
def test_a_debounced_task_saves_a_burst_of_edits_with_one_call(
    stack: Stack, tmp_path: Path
) -> None:
    debounce_s = 1.5
    hook = HookServer().start()
    try:
        _start(stack, tmp_path, hook, TEST_DEBOUNCE_MS=str(int(debounce_s * 1000)))
        stack.worker()
        stack.wait_all_owned()
        # When a burst of 6 edits to one draft is sent while the worker runs
        started = time.time()
        last_began, last_sent = _send(save_draft, stack, "draft", "d1", 6)
        stack.wait_journal(6)
        # Then the draft got every edit once, in order
        assert _items(hook) == {"draft:d1": list(range(6))}
        # With one call for the burst (one more for each debounce period the sending
        # itself took, on a slow machine), made no sooner than the debounce after it
        calls = [call for call in hook.calls if call.status == 200]
        assert len(calls) <= 1 + int((last_sent - started) / debounce_s)
        assert calls[0].at >= last_began + debounce_s - 0.05 or len(calls) > 1
    finally:
        hook.stop()


@SQLITE
def test_a_source_that_batches_a_task_taking_one_event_is_refused(
    stack: Stack, tmp_path: Path
) -> None:
    path = tmp_path / "sources.toml"
    path.write_text('[sources.a]\ntask = "post_to_hook"\nbatch = 5\nrecord_key = "k:{body:id}"\n')
    stack.settings = stack.settings.model_copy(update={"sources_file": path, "app": APP})
    worker = stack.worker()
    wait_until(lambda: not worker.alive(), 60, "the worker to refuse to start")
    assert "takes one event at a time" in worker.log()
