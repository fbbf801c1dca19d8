"""workers/blocking.py: the lanes' threads for blocking calls, each with its own store
connection (a real SQLite file)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.routing.contract.errors import StoreUnavailable
from keylane.routing.contract.logcontext import current_event, event_context
from keylane.workers.blocking import BlockingPool
from keylane.workers.store import RecordStore
from tests.support.lane_parts import SqliteOpener


@pytest.fixture
def opened(tmp_path: Path) -> SqliteOpener:
    return SqliteOpener(tmp_path / "store.sqlite3")


@pytest.fixture
def pool(opened: SqliteOpener) -> Iterator[BlockingPool]:
    pool = BlockingPool(2, opened, name="kltest-io")
    pool.start()
    yield pool
    pool.stop()


def read_revision(store: RecordStore, key: str) -> tuple[str, int]:
    return threading.current_thread().name, store.read(key).revision


def test_a_call_runs_in_a_pool_thread_with_the_callers_context(pool: BlockingPool) -> None:
    def where(n: int) -> tuple[str, dict[str, object], int]:
        return threading.current_thread().name, current_event(), n * 2

    async def lane() -> tuple[str, dict[str, object], int]:
        with event_context(source="crm", event_id="e1"):
            return await pool.call(where, 21)

    thread, context, answer = asyncio.run(lane())
    assert thread.startswith("kltest-io-")
    assert context == {"source": "crm", "event_id": "e1"}
    assert answer == 42


def test_a_calls_exception_is_raised_in_the_lane(pool: BlockingPool) -> None:
    def fails() -> None:
        raise KeyError("missing")

    async def lane() -> None:
        await pool.call(fails)

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(lane())


def test_a_store_is_opened_per_thread_on_first_use_and_kept(
    pool: BlockingPool, opened: SqliteOpener
) -> None:
    async def lane() -> list[tuple[str, int]]:
        await pool.call(time.sleep, 0)
        assert opened.stores == []  # a plain call opens none
        return [await pool.store(read_revision, "contact:1") for _ in range(6)]

    answers = asyncio.run(lane())
    assert {revision for _, revision in answers} == {0}
    # One store per thread that served a store call, whatever the number of calls
    assert len(opened.stores) == len({thread for thread, _ in answers}) <= 2


def test_a_store_that_was_unavailable_is_closed_and_reopened(opened: SqliteOpener) -> None:
    pool = BlockingPool(1, opened)
    pool.start()

    def unavailable(store: RecordStore) -> None:
        store.read("contact:1")
        raise StoreUnavailable("the disk went away")

    async def lane() -> int:
        with pytest.raises(StoreUnavailable):
            await pool.store(unavailable)
        _, revision = await pool.store(read_revision, "contact:1")
        return revision

    try:
        assert asyncio.run(lane()) == 0
    finally:
        pool.stop()
    first, second = opened.stores
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        first.read("contact:1")
    # And stop closed the second one
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        second.read("contact:1")


def test_no_more_calls_run_at_once_than_the_pool_has_threads(pool: BlockingPool) -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def busy() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    async def lanes() -> None:
        await asyncio.gather(*(pool.call(busy) for _ in range(6)))

    asyncio.run(lanes())
    assert most == 2


def test_stop_lets_the_queued_calls_finish(opened: SqliteOpener) -> None:
    pool = BlockingPool(1, opened)
    pool.start()
    done: list[int] = []

    async def lane() -> None:
        loop = asyncio.get_running_loop()
        futures = [asyncio.ensure_future(pool.call(done.append, n)) for n in range(3)]
        await asyncio.sleep(0)  # queued
        await loop.run_in_executor(None, pool.stop)
        await asyncio.gather(*futures)

    asyncio.run(lane())
    assert done == [0, 1, 2]
