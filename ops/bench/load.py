"""The benchmark's HTTP load: ``concurrency`` senders on one asyncio loop, each on its own
keep-alive connection, posting the next body as soon as its previous answer arrived.

The load generator runs in the benchmark's own process and needs CPU too: on a small
machine it competes with the server it measures, so its CPU time is reported with
every result.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

#: Answers a sender retries (with the same body: the receiver dedupes).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: How long one request may take before the sender counts a transport error.
TIMEOUT_S = 30.0


@dataclass
class LoadResult:
    """What one load run saw."""

    sent: int
    elapsed_s: float
    client_cpu_s: float
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    retries: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    #: Per body, in input order: when its first attempt was sent and its last answered
    #: (``perf_counter``), or None if it never got an answer.
    spans: list[tuple[float, float] | None] = field(default_factory=list)
    first_post_at: float = 0.0
    last_answer_at: float = 0.0

    @property
    def accepted(self) -> int:
        """Deliveries answered 202."""
        return self.statuses[202]

    @property
    def accepted_per_s(self) -> float:
        """202 answers per second of wall time."""
        return self.accepted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, pct: float) -> float:
        """Latency percentile (nearest rank) over every answered request."""
        if not self.latencies_ms:
            return math.nan
        ordered = sorted(self.latencies_ms)
        rank = max(1, math.ceil(pct / 100 * len(ordered)))
        return ordered[rank - 1]


def run_load(
    url: str | Sequence[str], bodies: Sequence[bytes], concurrency: int, retry: bool = False
) -> LoadResult:
    """POST every body to ``url`` with ``concurrency`` concurrent clients (several URLs:
    the clients are spread over them, as a load balancer would).

    With ``retry``, a transport error or a 429/5xx is retried (up to 10 times, with a
    short pause) as a sender would; the latency recorded is the final attempt's.
    """
    return _run(_load(url, bodies, concurrency, retry))


def run_paced(url: str, bodies: Sequence[bytes], rate_per_s: float) -> LoadResult:
    """POST every body to ``url`` one at a time on one connection, body ``i`` sent at
    ``i / rate_per_s`` seconds after the first (or as soon as the answer before it came,
    if that was later): a steady trickle, not a load as fast as the server answers. Each
    is retried as :func:`run_load` does with ``retry``."""
    return _run(_paced(url, bodies, rate_per_s))


async def _paced(url: str, bodies: Sequence[bytes], rate_per_s: float) -> LoadResult:
    result = LoadResult(sent=len(bodies), elapsed_s=0.0, client_cpu_s=0.0)
    result.spans = [None] * len(bodies)
    client = _Connection(url)
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        result.first_post_at = t0
        for index, body in enumerate(bodies):
            delay = t0 + index / rate_per_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await _send_one(client, index, body, True, result)
        result.last_answer_at = time.perf_counter()
        result.elapsed_s = result.last_answer_at - t0
        result.client_cpu_s = time.process_time() - cpu0
    finally:
        client.close()
    return result


def _run(coro: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


async def _load(
    url: str | Sequence[str], bodies: Sequence[bytes], concurrency: int, retry: bool
) -> LoadResult:
    urls = [url] if isinstance(url, str) else list(url)
    result = LoadResult(sent=len(bodies), elapsed_s=0.0, client_cpu_s=0.0)
    result.spans = [None] * len(bodies)
    queue: Iterator[tuple[int, bytes]] = iter(enumerate(bodies))
    clients = [_Connection(urls[n % len(urls)]) for n in range(concurrency)]
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        result.first_post_at = t0
        await asyncio.gather(*(_sender(client, queue, retry, result) for client in clients))
        result.last_answer_at = time.perf_counter()
        result.elapsed_s = result.last_answer_at - t0
        result.client_cpu_s = time.process_time() - cpu0
    finally:
        for client in clients:
            client.close()
    return result


class _Connection:
    """One sender's keep-alive HTTP/1.1 connection, POSTing JSON to one URL.

    Written for the load alone: a general client (httpx) spends about 0.8 ms of CPU per
    request here, a quarter of a 2-core machine at the rates measured, all of it taken
    from the processes under test. This one writes the request in one buffer and reads the
    status line, ``content-length`` and the body: what uvicorn answers.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n"
            "content-type: application/json\r\ncontent-length: "
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> int:
        """POST ``body``; the answer's status (0: the connection failed or timed out)."""
        try:
            return await asyncio.wait_for(self._exchange(body), TIMEOUT_S)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            return 0

    async def _exchange(self, body: bytes) -> int:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(b"%s%d\r\n\r\n%s" % (self.head, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, _, headers = head.partition(b"\r\n")
        length, closing = -1, False
        for line in headers.lower().split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip() == b"close":
                closing = True
        if length < 0:
            raise ValueError("an answer without content-length")
        await self.reader.readexactly(length)
        if closing:
            self.close()
        return int(status_line.split(b" ", 2)[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _sender(
    client: _Connection,
    queue: Iterator[tuple[int, bytes]],
    retry: bool,
    result: LoadResult,
) -> None:
    # One shared iterator on one loop: each body is taken by exactly one sender.
    for index, body in queue:
        await _send_one(client, index, body, retry, result)


async def _send_one(
    client: _Connection, index: int, body: bytes, retry: bool, result: LoadResult
) -> None:
    """POST body ``index`` until it is answered (retried as a sender would, with
    ``retry``) and record what came back."""
    first_sent = time.perf_counter()
    for attempt in range(11):
        started = time.perf_counter()
        status = await client.post(body)
        if retry and attempt < 10 and (status == 0 or status in RETRY_STATUSES):
            result.retries += 1
            await asyncio.sleep(0.05 * (attempt + 1))
            continue
        break
    if status == 0:
        result.transport_errors += 1
    else:
        answered = time.perf_counter()
        result.statuses[status] += 1
        result.latencies_ms.append((answered - started) * 1000)
        result.spans[index] = (first_sent, answered)


def get_ok(url: str) -> bool:
    """Whether ``GET url`` answers 200 right now."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
