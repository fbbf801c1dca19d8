"""A destination's flow control in Redis (:mod:`keylane.workers.flow`): the rate adapts to
what the destination admits, for every worker at once — the scripts on a real Redis, then
real processes against a real HTTP server that admits fewer calls than configured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import redis

from keylane.ops.bench.throttled import INTERRUPTS, Options, run_once
from keylane.ops.deployment_view import DeploymentView
from keylane.routing import ShardMap
from keylane.routing.contract.destinations import FlowState
from keylane.routing.redis_keys import RedisKeys
from keylane.workers.brokers.redis import RedisLaneBroker
from keylane.workers.flow import DestinationFlow
from tests.support.stack import wait_until

TTL_MS = 15_000


@pytest.fixture
def flow(redis_url: str, namespace: str) -> Iterator[tuple[DestinationFlow, DeploymentView]]:
    client = redis.Redis.from_url(redis_url)
    keys = RedisKeys(namespace)
    broker = RedisLaneBroker(client, keys, ShardMap(8))
    yield broker.flow, DeploymentView(client, keys, ShardMap(8))
    client.close()


def _state(view: DeploymentView, name: str = "api") -> FlowState:
    return next(d for d in view.destinations() if d.name == name)


def _done(flow: DestinationFlow, n: int, adaptive: bool = True) -> None:
    """``n`` calls that succeeded (each released as done)."""
    for i in range(n):
        flow.release("api", f"ok-{i}", "done", 0, False, TTL_MS, adaptive)


def _start(flow: DestinationFlow, slot: str, rate: float | None, adaptive: bool = True) -> None:
    """A call starts (the destination configured at ``rate``; no in-flight limit), as
    soon as the rate lets it."""
    wait_until(
        lambda: flow.acquire("api", slot, None, rate, TTL_MS, adaptive)[1] == "ok",
        10,
        f"the call {slot} to start",
    )


def _throttled(flow: DestinationFlow, slot: str, adaptive: bool = True) -> float | None:
    """The call in ``slot`` was answered 429 with Retry-After: 1; the new rate if cut."""
    return flow.release("api", slot, "retried", 1.0, True, TTL_MS, adaptive)


def test_a_429_cuts_the_rate_to_what_was_admitted_once_per_window(
    flow: tuple[DestinationFlow, DeploymentView],
) -> None:
    flows, view = flow
    # Given a destination (no configured rate) that admitted 4 calls just now
    _start(flows, "early", None)  # a call in flight since before it began to refuse
    _done(flows, 4)
    # When a call is answered 429
    _start(flows, "first", None)
    cut = _throttled(flows, "first")
    # Then its rate is 0.9 x the 4 calls admitted in the last second, for every worker
    assert cut == pytest.approx(3.6)
    state = _state(view)
    assert state.rate_now == pytest.approx(3.6)
    assert state.counters["rate_cuts"] == 1
    # When the call that was in flight before the cut is answered 429 too
    # Then it does not cut again: it answers for the same excess
    assert _throttled(flows, "early") is None
    assert _state(view).rate_now == pytest.approx(3.6)
    assert _state(view).counters["rate_cuts"] == 1
    # When a call started after the cut is refused
    _unpause(view)
    _start(flows, "later", None)
    # Then the rate is cut again, below the rate in force
    assert _throttled(flows, "later") == pytest.approx(0.9 * 3.6)


def test_successes_raise_the_rate_slowly_back_to_the_configured_one(
    flow: tuple[DestinationFlow, DeploymentView],
) -> None:
    flows, view = flow
    # Given a destination configured at 4 calls/s whose first call was answered 429
    _start(flows, "a", 4)
    # Then, nothing admitted yet, its rate is halved
    assert _throttled(flows, "a") == pytest.approx(2.0)
    assert _state(view).rate_per_s == 4
    # When calls succeed
    rates = []
    for _ in range(5):
        _done(flows, 1)
        rates.append(_state(view).rate_now)
    # Then each raises it a little: 0.05 calls/s over a second of successful calls
    assert rates == sorted(rates)
    assert rates[0] == pytest.approx(2.0 + 0.05 / 2.0, abs=1e-3)
    # And once it reaches the configured rate the destination is no longer adapted
    _done(flows, 800)
    state = _state(view)
    assert state.adapted_rate_per_s is None
    assert state.rate_now == 4


def test_a_destination_that_does_not_adapt_keeps_its_rate(
    flow: tuple[DestinationFlow, DeploymentView],
) -> None:
    flows, view = flow
    # Given a destination that was adapted, then configured with adaptive = false
    _start(flows, "a", 10)
    assert _throttled(flows, "a") is not None
    _unpause(view)
    _start(flows, "b", 10, adaptive=False)
    # Then its configured rate applies again, and a 429 does not cut it
    assert _state(view).rate_now == 10
    assert _throttled(flows, "b", adaptive=False) is None
    assert _state(view).rate_now == 10
    # But the Retry-After still pauses every call
    assert flows.acquire("api", "c", None, 10, TTL_MS, False)[1] == "paused"


def _unpause(view: DeploymentView) -> None:
    """End the Retry-After pause of a test's 429 now (its wait is not what is tested)."""
    view.client.hdel(view.keys.flow_bucket("api"), "paused")


@pytest.mark.slow
def test_throughput_against_a_destination_that_admits_less_than_configured(
    redis_url: str,
) -> None:
    # Given a destination admitting 4 calls/s (429, Retry-After: 1) and keylane at 20/s
    opts = Options(admit=4, retry_after_s=1, rate=20.0, events=24, records=6, redis_url=redis_url)
    with INTERRUPTS.installed(), ExitStack() as es:
        # When the same events go through with the rate fixed, then adaptive
        fixed = run_once(opts, adaptive=False, es=es)
        adaptive = run_once(opts, adaptive=True, es=es)
    print(f"\nfixed: {fixed}\nadaptive: {adaptive}")
    # Then every event was delivered once, in order per record, both times (run_once
    # checks it)
    assert fixed.events == adaptive.events == 24
    # And the adaptive rate settles below the limit: in the second half of its run it meets
    # it at most once (a fixed rate keeps meeting it; how often depends on how fast a busy
    # machine sends, so only the adaptive run's settling is asserted)
    assert adaptive.late_throttled <= 1, (fixed, adaptive)
