"""The versus benchmark's senders: ``threads`` threads, each owning a share of the records
and sending its records' deliveries in workload order, each only once the previous one
was accepted. So every record's events are accepted in the order they were sent.

"Accepted" is the 2xx answer of keylane's receiver, or the return of ``send_task`` for
the Celery baselines. A delivery refused with 429/5xx, or lost in transport, is sent
again, as webhook senders do.

Each system is sent to through the thinnest client of its protocol, so the load generator
(32 threads sharing the machine's cores with the systems under test) takes as little of
the CPU as it can: Celery's own ``send_task``, and for keylane the standard library's
``http.client`` on one keep-alive connection per thread, about 0.1 ms of CPU per POST
against 0.35-0.4 ms through httpx's client (measured on the project's VM).
"""

from __future__ import annotations

import contextlib
import http.client
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .versus_work import Delivery, Workload, sender_of

#: Sends one delivery; returns the number of retries it took, raises :class:`SendFailed`.
SendOne = Callable[[Delivery], int]
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ATTEMPTS = 20


class SendFailed(RuntimeError):
    """A delivery was never accepted."""


@dataclass
class Sent:
    """What the senders saw: when each delivery was accepted (``time.time()``)."""

    accepted_at: list[float | None]
    first_send_at: float = 0.0
    last_accept_at: float = 0.0
    retries: int = 0
    failures: list[str] = field(default_factory=list)


def send_all(
    work: Workload, threads: int, open_sender: Callable[[], AbstractContextManager[SendOne]]
) -> Sent:
    """Send every delivery of ``work`` from ``threads`` threads (see the module docstring)."""
    shares: list[list[Delivery]] = [[] for _ in range(threads)]
    for delivery in work.deliveries:
        shares[sender_of(delivery.record, threads)].append(delivery)
    sent = Sent(accepted_at=[None] * len(work.deliveries))
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def run(share: list[Delivery]) -> None:
        retries = 0
        try:
            with open_sender() as send:
                start.wait()
                for delivery in share:
                    retries += send(delivery)
                    sent.accepted_at[delivery.index] = time.time()
        except Exception as exc:  # reported with the run, never silently dropped
            start.abort()  # a sender that could not start must not hold the others
            with lock:
                sent.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            with lock:
                sent.retries += retries

    workers = [threading.Thread(target=run, args=(s,), daemon=True) for s in shares]
    for worker in workers:
        worker.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # its failure is in the run's
        start.wait(timeout=60)
    sent.first_send_at = time.time()
    for worker in workers:
        worker.join()
    sent.last_accept_at = max((t for t in sent.accepted_at if t is not None), default=0.0)
    return sent


@contextlib.contextmanager
def http_sender(url: str, body_of: Callable[[Delivery], bytes]) -> Iterator[SendOne]:
    """POST each delivery's body to ``url`` (``http://host:port/path``) on one keep-alive
    connection; a connection that fails is opened again for the next attempt."""
    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
    headers = {"content-type": "application/json"}
    connection = http.client.HTTPConnection(host, port, timeout=30.0)
    try:

        def post(body: bytes) -> int:
            try:
                connection.request("POST", path, body=body, headers=headers)
                answer = connection.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException):
                connection.close()  # the next request connects again
                return 0
            if answer.will_close:
                connection.close()
            return answer.status

        def send(delivery: Delivery) -> int:
            body = body_of(delivery)
            for attempt in range(MAX_ATTEMPTS):
                status = post(body)
                if status in (200, 202):
                    return attempt
                if status and status not in RETRY_STATUSES:
                    raise SendFailed(f"delivery {delivery.index}: answered {status}")
                time.sleep(0.05 * (attempt + 1))
            raise SendFailed(f"delivery {delivery.index}: not accepted after {MAX_ATTEMPTS} tries")

        yield send
    finally:
        connection.close()


@contextlib.contextmanager
def publisher(publish: Callable[[Delivery], None]) -> Iterator[SendOne]:
    """Each delivery handed to ``publish`` (a Celery ``send_task``); no retries."""

    def send(delivery: Delivery) -> int:
        try:
            publish(delivery)
        except Exception as exc:  # a broker error is this delivery's failure, reported
            raise SendFailed(f"delivery {delivery.index}: publish failed: {exc!r}") from exc
        return 0

    yield send
