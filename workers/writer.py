"""One writer process per SQLite store.

SQLite has one write lock for the whole file. A worker process paused while it holds that
lock (GC, VM freeze, a debugger, a full disk) stops every other process's writes, and
fencing cannot help: the others cannot even register their fencing tokens, so the paused
worker's shards and their own stall until it resumes. A deployment on SQLite therefore runs
ONE worker process (many lanes in it), and PostgreSQL is the store for several.

This module enforces it. A worker on SQLite claims the deployment's writer key in Redis
before it starts, renews the claim with every heartbeat and gives it up when it stops. A
second worker finds the claim taken and refuses to start, unless the holder is known to be
gone: a process of this host that no longer runs is replaced at once; a holder elsewhere
is waited for until its claim runs out (a live one renews it, and the newcomer refuses).
A claim that ran out without a release is remembered with its holder, so a process of this
host that is paused past the claim's lifetime still keeps a newcomer out.
A writer that wakes from a pause to find its claim taken over exits (its fencing tokens
are stale by then too).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from ..routing.contract.errors import BrokerUnavailable, ConfigError
from ..routing.contract.settings import Settings
from .brokers.redis import RedisLaneBroker

log = logging.getLogger("keylane.writer")

#: Exit status of a worker whose writer claim was taken over while it was paused
#: (EX_TEMPFAIL: started again, it waits for or refuses to the new writer).
EXIT_NOT_THE_WRITER = 75

ProcessState = Literal["running", "stopped", "gone", "elsewhere"]


class StoreWriter:
    """This worker's claim on being the SQLite store's one writer."""

    def __init__(
        self,
        broker: RedisLaneBroker,
        settings: Settings,
        worker_id: str,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.worker_id = worker_id
        self._sleep = sleep
        self._clock = clock

    def claim(self) -> None:
        """Become the writer, or raise :class:`ConfigError` saying who is."""
        s = self.settings
        deadline = self._clock() + (s.lease_ttl_ms + s.heartbeat_ms) / 1000
        holder, expired = self.broker.claim_store_writer(self.worker_id, s.lease_ttl_ms)
        while holder != self.worker_id:
            state = process_state(holder)
            # A holder elsewhere whose claim ran out did not renew it: it is gone (a paused
            # one exits when it wakes to find the claim taken).
            if state == "gone" or (expired and state == "elsewhere"):
                log.warning("taking the SQLite store over from %s, which no longer runs", holder)
                holder, expired = self.broker.claim_store_writer(
                    self.worker_id, s.lease_ttl_ms, replacing=holder
                )
                continue
            if state in ("running", "stopped") or self._clock() > deadline:
                raise ConfigError(self._refusal(holder, state))
            self._sleep(min(0.25, s.heartbeat_ms / 1000))
            holder, expired = self.broker.claim_store_writer(self.worker_id, s.lease_ttl_ms)
        # Claimed twice at start (before Celery starts, then by the lanes): the worker's
        # start-up line says it once.
        log.debug("this worker is the SQLite store's one writer (%s)", self.worker_id)

    def renew(self) -> str:
        """Renew the claim; the holder now (another worker's id: the claim was lost)."""
        holder, _ = self.broker.claim_store_writer(self.worker_id, self.settings.lease_ttl_ms)
        return holder

    def renew_or_exit(self) -> None:
        """Renew the claim (with every heartbeat). Another writer took it while this
        process was paused past its TTL: this one must not write again, so it exits (its
        leases and fencing tokens are stale too)."""
        try:
            holder = self.renew()
        except BrokerUnavailable as exc:
            log.warning("cannot renew the SQLite writer claim: %s", exc)
            return
        if holder != self.worker_id:
            log.critical(
                "worker %s took the SQLite store over while this one was paused; exiting",
                holder,
            )
            logging.shutdown()
            os._exit(EXIT_NOT_THE_WRITER)

    def release(self) -> None:
        """Give the claim up (graceful stop), so that the next writer starts at once."""
        self.broker.release_store_writer(self.worker_id)

    def _refusal(self, holder: str, state: ProcessState) -> str:
        where = {
            "running": "a running process of this host",
            "stopped": "a process of this host that is stopped (paused): it keeps SQLite's "
            "write lock until it is resumed or killed",
            "elsewhere": "a worker on another host, which keeps renewing its claim",
            "gone": "",
        }[state]
        return (
            f"another worker writes to the SQLite store {self.settings.store_dsn()}: {holder} "
            f"({where}). SQLite takes one writer process, so this worker does not start. Run "
            "more lanes in that worker (--lanes N, KEYLANE_LANES), or use PostgreSQL "
            "(KEYLANE_STORE_URL=postgresql://...) to run several worker processes."
        )


def process_state(worker_id: str) -> ProcessState:
    """What is known of the process behind ``worker_id`` (``<host>:<pid>:<random>``)."""
    host, _, pid_text = worker_id.rpartition(":")[0].rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return "elsewhere"
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "running"
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "running"
    if state in ("Z", "X"):  # a zombie no longer runs (its parent has not reaped it yet)
        return "gone"
    return "stopped" if state in ("T", "t") else "running"
