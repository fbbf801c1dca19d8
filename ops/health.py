"""``keylane check`` (and ``keylane up --check``): health as an exit code, for orchestrators.

Checks, each with a one-line verdict: Redis answers; the store answers (creating nothing);
every shard has a live owner; no shard's oldest event (queued or in flight) is older than
a limit; and, when given a receiver URL, the receiver is ready.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ..routing.contract.settings import Settings
from .cli_common import cli_store
from .deployment_view import DeploymentView
from .embedded_redis import with_embedded_redis
from .status import collect_status
from .views import open_view


@dataclass(frozen=True)
class Check:
    """One health check's verdict."""

    name: str
    ok: bool
    detail: str


def run_checks(
    settings: Settings, receiver_url: str | None = None, max_age_s: float | None = None
) -> list[Check]:
    """Every check, in order; a check that cannot run is a failed check, not an error."""
    checks: list[tuple[str, Callable[[], Check]]] = [
        ("redis", lambda: _redis(settings)),
        ("store", lambda: _store(settings)),
        ("shards", lambda: _shards(settings, max_age_s)),
    ]
    if receiver_url:
        checks.append(("receiver", lambda: _receiver(receiver_url)))
    results = []
    for name, check in checks:
        try:
            results.append(check())
        except Exception as exc:  # report, do not crash: the exit code is the answer
            results.append(Check(name, False, f"{type(exc).__name__}: {exc}"))
    return results


def run_checks_until_healthy(
    settings: Settings,
    receiver_url: str | None = None,
    max_age_s: float | None = None,
    wait_s: float = 0.0,
) -> list[Check]:
    """:func:`run_checks` again, every half second, until every check passes or ``wait_s``
    has passed (``keylane up --check --wait``: a stack just started answers in a few
    seconds, more on a busy machine); the last verdicts."""
    deadline = time.monotonic() + wait_s
    while True:
        # The embedded Redis of a `keylane up` still starting is found when it answers.
        results = run_checks(with_embedded_redis(settings), receiver_url, max_age_s)
        if all(r.ok for r in results) or time.monotonic() >= deadline:
            return results
        time.sleep(0.5)


def _redis(settings: Settings) -> Check:
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    started = time.monotonic()
    try:
        view.ping()
    finally:
        view.close()
    return Check("redis", True, f"answers ({(time.monotonic() - started) * 1000:.1f} ms)")


def _store(settings: Settings) -> Check:
    store = cli_store(settings)  # creates nothing: a store that is not there fails the check
    try:
        store.fence_of(0)
    finally:
        store.close()
    return Check("store", True, "answers")


def _shards(settings: Settings, max_age_s: float | None) -> Check:
    view = open_view(settings)
    try:
        report = collect_status(settings, view)
    finally:
        view.close()
    if report["unowned"]:
        unowned = report["unowned"]
        return Check("shards", False, f"{len(unowned)} shard(s) without an owner: {unowned[:10]}")
    if max_age_s is not None:
        stale = [
            s["shard"]
            for s in report["shards"]
            if s["oldest_age_s"] is not None and s["oldest_age_s"] > max_age_s
        ]
        if stale:
            return Check(
                "shards", False, f"shard(s) {stale[:10]} have events older than {max_age_s:.0f}s"
            )
    workers = len(report["workers"])
    return Check("shards", True, f"all {settings.shard_count} owned by {workers} worker(s)")


def _receiver(url: str) -> Check:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/readyz", timeout=5) as reply:  # noqa: S310
            return Check("receiver", reply.status == 200, f"{url} ready")
    except urllib.error.HTTPError as exc:
        return Check("receiver", False, f"{url} answered {exc.code}")
    except OSError as exc:
        return Check("receiver", False, f"{url} unreachable: {exc}")
