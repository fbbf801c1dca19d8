"""Load that checks itself: per-key sequential senders whose events can be verified
exactly afterwards (every event applied once, in order)."""

from __future__ import annotations

import threading
import time

import httpx

from keylane.workers.stores.sql import SqlStore
from tests.support.stack import Stack


class SequentialLoad:
    """One sender thread per record key. Sender k sends events 1..n for its key in order,
    each until it gets a 2xx (retrying the same event on a transport error or a 5xx, as a
    real sender does), so the record must end with ``seq == [1..n]`` and
    ``total == n(n+1)/2``."""

    def __init__(
        self,
        stack: Stack,
        keys: list[str],
        per_key: int,
        prefix: str = "ev",
        deadline_s: float = 240,
        urls: list[str] | None = None,
        honour_retry_after: bool = False,
    ) -> None:
        self.stack = stack
        self.urls = urls  # receivers to alternate between: a sender fails over on errors
        self.honour_retry_after = honour_retry_after
        self.refusals: list[tuple[int, str, str | None]] = []  # (status, error, Retry-After)
        self.keys = keys
        self.per_key = per_key
        self.prefix = prefix
        self.deadline = time.monotonic() + deadline_s
        self.accepted = 0
        self.retries = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, args=(k,), daemon=True) for k in keys]

    @property
    def total(self) -> int:
        """Events the load sends in all."""
        return len(self.keys) * self.per_key

    def start(self) -> SequentialLoad:
        for thread in self._threads:
            thread.start()
        return self

    def join(self) -> None:
        for thread in self._threads:
            thread.join(max(0.0, self.deadline - time.monotonic()) + 5)
        assert not self.errors, self.errors[:5]
        assert self.accepted == self.total, f"{self.accepted} of {self.total} accepted"

    def progress(self) -> float:
        """Fraction of events accepted so far."""
        return self.accepted / self.total

    def _send(self, key: str) -> None:
        with httpx.Client(timeout=10) as client:
            for n in range(1, self.per_key + 1):
                body = {
                    "id": f"{self.prefix}-{key}-{n}",
                    "type": "load",
                    "record_key": key,
                    "changes": {"seq": {"append": n}, "total": {"increment": n}},
                }
                if not self._deliver(client, body):
                    return

    def _deliver(self, client: httpx.Client, body: dict[str, object]) -> bool:
        attempt = 0
        while time.monotonic() < self.deadline:
            url = self.urls[attempt % len(self.urls)] if self.urls else None
            attempt += 1
            try:
                answer = self.stack.post(body, client=client, url=url)
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code in (200, 202):
                with self._lock:
                    self.accepted += 1
                return True
            if answer is not None and answer.status_code < 500:
                with self._lock:
                    self.errors.append(f"{answer.status_code} {answer.text}")
                return False
            wait_s = 0.1
            with self._lock:
                self.retries += 1
                if answer is not None:
                    after = answer.headers.get("retry-after")
                    self.refusals.append(
                        (answer.status_code, answer.json().get("error", ""), after)
                    )
                    if self.honour_retry_after and after:
                        wait_s = min(float(after), 1.0)  # capped: the test has a deadline
            time.sleep(wait_s)
        with self._lock:
            self.errors.append(f"gave up on {body['id']}")
        return False

    def verify(self, store: SqlStore) -> None:
        """Every event applied exactly once, in order, for every key."""
        n = self.per_key
        for key in self.keys:
            fields = store.read(key).fields
            assert fields.get("seq") == list(range(1, n + 1)), (key, fields.get("seq"))
            assert fields.get("total") == n * (n + 1) // 2, (key, fields.get("total"))
            entries = store.journal_entries(key)
            assert len(entries) == n, (key, len(entries))
            assert all(e.outcome == "applied" for e in entries), key
