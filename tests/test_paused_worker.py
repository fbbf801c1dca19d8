"""A worker paused in the middle of a store write (GC, VM freeze, a debugger, a full disk)
never stalls the shards it does not own, and its own move within the lease TTL plus one
heartbeat; heartbeats never wait on the store.

The pause is held deterministically inside the write transaction by a trigger the test
puts on the journal table of its own store: PostgreSQL sleeps in it, SQLite computes in it
(holding SQLite's write lock). The test stops the worker (SIGSTOP) while the trigger runs,
and checks that the transaction is still open after the stop.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keylane.ops.audit import audit_journal, audit_lease_log
from keylane.routing.contract.errors import ConfigError
from keylane.workers.service import new_worker_id
from keylane.workers.store import FenceStore
from keylane.workers.writer import StoreWriter, process_state
from tests.support.stack import REPO, Proc, Stack, event, settings_env, wait_until

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
POSTGRES = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

REPETITIONS = 20
#: Pauses of a PostgreSQL worker mid-write: each costs a lease TTL and a heartbeat.
PG_PAUSES = 10
#: This machine's scheduling on top of the bound (the suite shares two cores).
SLACK_S = 1.0


# -- holding a write in the middle of its transaction --------------------------------------


def _hold_postgres_writes(store_url: str) -> None:
    """Every journal insert of a ``paused:`` record sleeps for 0.3 s inside its
    transaction (after the fence row was locked and the record written)."""
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION hold_paused() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.record_key LIKE 'paused:%' THEN PERFORM pg_sleep(0.3); END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER hold_paused BEFORE INSERT ON journal "
            "FOR EACH ROW EXECUTE FUNCTION hold_paused()"
        )


def _held_backend(conn: psycopg.Connection[Any]) -> int | None:
    """The backend sleeping in the trigger, if any."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event = 'PgSleep' AND query LIKE '%INSERT INTO journal%'"
    ).fetchone()
    return int(row[0]) if row else None


def _in_transaction(conn: psycopg.Connection[Any], backend: int) -> bool:
    row = conn.execute(
        "SELECT state FROM pg_stat_activity WHERE pid = %s AND xact_start IS NOT NULL",
        (backend,),
    ).fetchone()
    return row is not None and row[0] in ("active", "idle in transaction")


def _sqlite_path(stack: Stack) -> Path:
    return Path(stack.settings.store_dsn().removeprefix("sqlite://"))


def _hold_sqlite_writes(path: Path) -> None:
    """Every journal insert of a ``paused:`` record computes for a moment inside its
    transaction, holding SQLite's write lock."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE burn (x INTEGER)")
        conn.executemany("INSERT INTO burn VALUES (?)", [(n,) for n in range(120)])
        conn.execute(
            "CREATE TRIGGER hold_paused BEFORE INSERT ON journal "
            "WHEN NEW.record_key LIKE 'paused:%' BEGIN "
            "SELECT count(*) FROM burn a, burn b, burn c WHERE a.x + b.x + c.x >= 0; END"
        )
    conn.close()


def _write_locked(path: Path) -> bool:
    """Whether some process holds SQLite's write lock now."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return True
    finally:
        conn.close()


@contextmanager
def _store_locked(stack: Stack) -> Iterator[None]:
    """Another process holds what registering a fencing token needs: SQLite's write lock,
    or PostgreSQL's fence table."""
    url = stack.settings.store_dsn()
    if stack.settings.store_is_sqlite:
        conn = sqlite3.connect(_sqlite_path(stack), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    with psycopg.connect(url) as pg:
        pg.execute("LOCK TABLE shard_fences IN EXCLUSIVE MODE")
        yield
        pg.rollback()


def _pause(proc: Proc) -> None:
    """SIGSTOP, and wait until the kernel has stopped every thread of the process."""
    proc.signal(signal.SIGSTOP)
    wait_until(lambda: process_state(f"{socket.gethostname()}:{proc.pid}:x") == "stopped", 10, "")


# -- who owns what -----------------------------------------------------------------------


def _holders(stack: Stack) -> dict[int, tuple[str, int]]:
    """Shard -> (worker id, fencing token) of its lease."""
    out = {}
    for shard, value in stack.view().lease_values().items():
        worker, token = value.rsplit("/", 1)
        out[shard] = (worker, int(token))
    return out


def _worker_id(stack: Stack, proc: Proc) -> str:
    found: list[str] = []

    def joined() -> bool:
        found[:] = [m["worker"] for m in stack.view().members() if m["info"]["pid"] == proc.pid]
        return bool(found)

    wait_until(joined, 30, f"{proc.name} to join", on_timeout=stack.logs)
    return found[0]


def _registered(store: FenceStore, holders: dict[int, tuple[str, int]], shards: set[int]) -> bool:
    """Every one of ``shards`` is leased, and its token registered with the store."""
    return all(s in holders and store.fence_of(s) == holders[s][1] for s in shards)


def _balanced(stack: Stack, store: FenceStore, workers: int) -> bool:
    holders = _holders(stack)
    counts: dict[str, int] = {}
    for worker, _ in holders.values():
        counts[worker] = counts.get(worker, 0) + 1
    return (
        len(holders) == stack.settings.shard_count
        and len(counts) == workers
        and max(counts.values()) - min(counts.values()) <= 1
        and _registered(store, holders, set(holders))
    )


def _key_on(stack: Stack, shards: set[int], prefix: str) -> str:
    """A record key of one of ``shards``."""
    shard_of = stack.settings.shards.shard_for_key
    return next(k for k in (f"{prefix}{n}" for n in range(100_000)) if shard_of(k) in shards)


def _wait_for(value: Callable[[], Any], timeout_s: float, what: str) -> Any:
    found: list[Any] = []
    wait_until(lambda: bool(found.append(value()) or found[-1]), timeout_s, what, interval_s=0.01)
    return found[-1]


# -- PostgreSQL: the other workers take over ---------------------------------------------


@POSTGRES
def test_a_worker_paused_mid_write_costs_the_others_at_most_ttl_plus_one_heartbeat(
    stack: Stack,
) -> None:
    # Given two workers on PostgreSQL (leases of 3 s, short enough that 10 pauses stay
    # cheap, long enough that a busy machine's scheduling is not mistaken for the others
    # waiting on the paused one), and writes of paused:* records that stop half-way
    # through their transaction for a moment
    stack.settings = stack.settings.model_copy(update={"lease_ttl_ms": 3000, "heartbeat_ms": 500})
    s = stack.settings
    store = stack.open_store()
    store.migrate()
    _hold_postgres_writes(s.store_dsn())
    workers = [stack.worker(lanes=2), stack.worker(lanes=2)]
    ids = [_worker_id(stack, w) for w in workers]
    stack.receiver()
    bound_s = (s.lease_ttl_ms + s.heartbeat_ms) / 1000
    takeovers: list[float] = []
    flowed: list[float] = []
    with psycopg.connect(s.store_dsn(), autocommit=True) as pg:
        for rep in range(PG_PAUSES):
            victim, victim_id, other_id = workers[rep % 2], ids[rep % 2], ids[1 - rep % 2]
            wait_until(lambda: _balanced(stack, store, 2), 60, "both workers to own shards")
            holders = _holders(stack)
            victims = {shard for shard, (w, _) in holders.items() if w == victim_id}
            others = set(holders) - victims
            key = _key_on(stack, victims, f"paused:{rep}:")
            # When the victim is stopped (SIGSTOP) in the middle of a write of one of its
            # shards, with its transaction open
            assert stack.post(event(f"p-{rep}", key, n={"increment": 1})).status_code == 202
            backend = _wait_for(lambda: _held_backend(pg), 30, "the write to be held")
            paused_at = time.monotonic()
            _pause(victim)
            try:
                assert _in_transaction(pg, backend), "the victim stopped mid-transaction"
                # Then the other worker's shards keep flowing while the victim is stopped
                for n in range(4):
                    other_key = _key_on(stack, others, f"flow:{rep}:{n}:")
                    body = event(f"f-{rep}-{n}", other_key, n={"increment": 1})
                    assert stack.post(body).status_code == 202
                wait_until(
                    lambda rep=rep: all(
                        store.journal("demo", f"f-{rep}-{n}") is not None for n in range(4)
                    ),
                    30,
                    "the other worker's events",
                )
                flowed.append(time.monotonic() - paused_at)
                # And every shard of the victim is owned again, token registered, within
                # the lease TTL plus one heartbeat
                wait_until(
                    lambda v=victims, o=other_id: _taken_over(stack, store, v, o),
                    bound_s + 30,
                    "the takeover",
                    on_timeout=stack.logs,
                )
                takeovers.append(time.monotonic() - paused_at)
                # And the held event is applied once, by the new owner
                stack.wait_journal(5 * (rep + 1), timeout_s=60)
                entry = store.journal("demo", f"p-{rep}")
                assert entry is not None
                assert entry.fence == _holders(stack)[s.shards.shard_for_key(key)][1]
            finally:
                victim.signal(signal.SIGCONT)
    print(  # the numbers, for whoever runs this with -s
        f"\ntakeover after a pause mid-write, {len(takeovers)} runs: max {max(takeovers):.2f}s "
        f"mean {sum(takeovers) / len(takeovers):.2f}s (bound {bound_s:.2f}s); other shards "
        f"flowed within max {max(flowed):.2f}s"
    )
    assert len(takeovers) == PG_PAUSES
    assert max(flowed) < s.lease_ttl_ms / 1000, flowed
    assert max(takeovers) <= bound_s + SLACK_S, takeovers
    # And nothing was lost or applied twice, and no shard ever had two owners
    for rep in range(PG_PAUSES):
        assert store.journal("demo", f"p-{rep}") is not None
    assert store.journal_size() == 5 * PG_PAUSES
    assert all(store.read(k).fields == {"n": 1} for k in store.record_keys(limit=1000))
    assert audit_lease_log(stack.view().lease_events()) == []
    assert audit_journal(store.journal_entries()) == []


def _taken_over(stack: Stack, store: FenceStore, shards: set[int], new_owner: str) -> bool:
    holders = _holders(stack)
    return all(holders.get(s, ("", 0))[0] == new_owner for s in shards) and _registered(
        store, holders, shards
    )


# -- SQLite: one writer process ------------------------------------------------------------


@SQLITE
def test_a_sqlite_writer_paused_mid_write_keeps_every_other_worker_out(stack: Stack) -> None:
    # Given the one worker of a SQLite store, and writes of paused:* records that keep
    # SQLite's write lock for a moment half-way through their transaction
    store = stack.open_store()
    store.migrate()
    path = _sqlite_path(stack)
    _hold_sqlite_writes(path)
    writer = stack.worker(lanes=2)
    stack.receiver()
    wait_until(lambda: _balanced(stack, store, 1), 30, "the writer to own every shard")
    for rep in range(REPETITIONS):
        # When it is stopped (SIGSTOP) in the middle of a write, holding the lock
        assert stack.post(event(f"p-{rep}", f"paused:{rep}", n={"increment": 1})).status_code == 202
        _wait_for(lambda: _write_locked(path), 30, "the write to be held")
        _pause(writer)
        try:
            assert _write_locked(path), "the writer stopped mid-transaction"
            # Then a second worker refuses to start, saying why and what to do instead
            if rep == 0:
                refused = subprocess.run(
                    [sys.executable, "-m", "keylane.ops.cli", "worker"],
                    env=settings_env(stack.settings),
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert refused.returncode == 2, refused.stdout + refused.stderr
                assert "SQLite takes one writer process" in refused.stderr
                assert "stopped (paused)" in refused.stderr
                assert "--lanes" in refused.stderr
                assert "PostgreSQL" in refused.stderr
            else:
                broker = stack.broker()
                with pytest.raises(ConfigError, match=r"stopped \(paused\)"):
                    StoreWriter(broker, stack.settings, new_worker_id()).claim()
                broker.close()
        finally:
            writer.signal(signal.SIGCONT)
        # And resumed, the writer finishes its write and goes on
        stack.wait_journal(rep + 1)
    assert writer.alive()
    assert len(_holders(stack)) == stack.settings.shard_count
    assert {w for w, _ in _holders(stack).values()} == {_worker_id(stack, writer)}
    # When the writer is killed (SIGKILL) in the middle of a write, and started again, as
    # `keylane up` does
    assert stack.post(event("p-kill", "paused:kill", n={"increment": 1})).status_code == 202
    _wait_for(lambda: _write_locked(path), 30, "the write to be held")
    writer.kill()
    replacement = stack.worker(lanes=2)
    # Then the new worker takes the store over at once (its holder is gone) and applies
    # the event, once
    stack.wait_journal(REPETITIONS + 1, timeout_s=60)
    assert replacement.alive(), replacement.log()
    assert "no longer runs" in replacement.log()
    for key in [f"paused:{rep}" for rep in range(REPETITIONS)] + ["paused:kill"]:
        assert store.read(key).fields == {"n": 1}, key
    assert audit_lease_log(stack.view().lease_events()) == []
    assert audit_journal(store.journal_entries()) == []


# -- heartbeats ----------------------------------------------------------------------------


def test_heartbeats_never_wait_on_the_store(stack: Stack) -> None:
    # Given a store that cannot register fencing tokens for twice the lease TTL, because
    # another process holds SQLite's write lock or PostgreSQL's fence table
    stack.settings = stack.settings.model_copy(update={"store_timeout_ms": 500})
    s = stack.settings
    store = stack.open_store()
    store.migrate()
    stack.receiver()
    key = "waiting:1"
    shard = s.shards.shard_for_key(key)
    busy = s.keys.busy(shard)
    view = stack.view()
    with _store_locked(stack):
        # When a worker starts, acquires its shards and an event arrives meanwhile
        worker = stack.worker(lanes=2)
        worker_id = _worker_id(stack, worker)
        assert stack.post(event("w-1", key, n={"increment": 1})).status_code == 202
        wait_until(lambda: shard in view.lease_values(), 30, "the shard's lease")
        # Then its heartbeat never lapses: membership and leases are renewed every beat
        ages: list[float] = []
        deadline = time.monotonic() + 2 * s.lease_ttl_ms / 1000
        while time.monotonic() < deadline:
            beat_ms = next(m["heartbeat_ms"] for m in view.members() if m["worker"] == worker_id)
            ages.append(time.time() - beat_ms / 1000)
            # And nothing is taken from a shard whose token the store has not registered
            assert view.client.hlen(busy) == 0
            time.sleep(s.heartbeat_ms / 4000)
        assert max(ages) < s.lease_ttl_ms / 1000, ages
        assert worker.alive(), worker.log()
    # And once the store answers, every shard is registered and the event applied once
    stack.wait_journal(1, timeout_s=60)
    wait_until(lambda: _balanced(stack, store, 1), 60, "every token registered")
    assert store.read(key).fields == {"n": 1}
    assert audit_lease_log(view.lease_events()) == []
