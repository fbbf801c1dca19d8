"""The benchmark's HTTP load: ``concurrency`` clients on one asyncio loop (httpx), each
posting the next body as soon as its previous answer arrived.

The load generator runs in the benchmark's own process and needs CPU too: on a small
machine it competes with the server it measures, so its CPU time is reported with
every result.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

#: Answers a sender retries (with the same body: the receiver dedupes).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
HEADERS = {"content-type": "application/json"}


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
    # One client (one keep-alive connection) per sender: httpcore's shared pool spends
    # CPU per request in proportion to its connections, which would bill the load
    # generator's bookkeeping to the server under test.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    result = LoadResult(sent=len(bodies), elapsed_s=0.0, client_cpu_s=0.0)
    result.spans = [None] * len(bodies)
    queue: Iterator[tuple[int, bytes]] = iter(enumerate(bodies))
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=30.0))
            for _ in range(concurrency)
        ]
        cpu0, t0 = time.process_time(), time.perf_counter()
        result.first_post_at = t0
        await asyncio.gather(
            *(_sender(c, urls[n % len(urls)], queue, retry, result) for n, c in enumerate(clients))
        )
        result.last_answer_at = time.perf_counter()
        result.elapsed_s = result.last_answer_at - t0
        result.client_cpu_s = time.process_time() - cpu0
    return result


async def _sender(
    client: httpx.AsyncClient,
    url: str,
    queue: Iterator[tuple[int, bytes]],
    retry: bool,
    result: LoadResult,
) -> None:
    # One shared iterator on one loop: each body is taken by exactly one sender.
    for index, body in queue:
        first_sent = time.perf_counter()
        for attempt in range(11):
            started = time.perf_counter()
            try:
                answer = await client.post(url, content=body, headers=HEADERS)
            except httpx.TransportError:
                status = 0
            else:
                status = answer.status_code
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
