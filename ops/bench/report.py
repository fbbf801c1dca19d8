"""The benchmark's results: the table people read and the one-line JSON machines read."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..tables import render_table
from .e2e import DirectRun
from .load import LoadResult
from .receiver_report import ReceiverResults
from .trickle_report import TrickleResults


@dataclass(frozen=True)
class E2eRun:
    """One end-to-end run: from the first POST until the journal holds every event."""

    keys: int
    events: int
    load: LoadResult
    done_s: float
    receiver_cpu_s: float
    workers_cpu_s: float
    redis_cpu_s: float
    direct: DirectRun

    @property
    def applied_per_s(self) -> float:
        """Events applied per second, first POST to last journal entry."""
        return self.events / self.done_s

    @property
    def direct_per_s(self) -> float:
        """Events applied per second by the direct baseline."""
        return self.events / self.direct.elapsed_s

    @property
    def drain_s(self) -> float:
        """How long after the last answer the last event was applied."""
        return max(0.0, self.done_s - self.load.elapsed_s)

    def as_json(self) -> dict[str, Any]:
        """The numbers of this run."""
        return {
            "keys": self.keys,
            "applied_per_s": round(self.applied_per_s, 1),
            "direct_per_s": round(self.direct_per_s, 1),
            "ratio": round(self.applied_per_s / self.direct_per_s, 3),
            "accepted_per_s": round(self.events / self.load.elapsed_s, 1),
            "drain_s": round(self.drain_s, 3),
            "receiver_cpu_ms_per_event": round(self.receiver_cpu_s / self.events * 1000, 3),
            "workers_cpu_ms_per_event": round(self.workers_cpu_s / self.events * 1000, 3),
            "direct_cpu_ms_per_event": round(self.direct.cpu_s / self.events * 1000, 3),
            "redis_cpu_ms_per_event": round(self.redis_cpu_s / self.events * 1000, 3),
            "sender_retries": self.load.retries,
            "p99_accept_ms": round(self.load.percentile_ms(99), 2),
        }


@dataclass(frozen=True)
class DrainRun:
    """One drain run: the shard queues filled beforehand, then ``workers`` worker
    processes started; the clocks read when every shard was owned and when the journal
    held every event (seconds counted from starting the workers)."""

    workers: int
    keys: int
    events: int
    owned_s: float | None  # None: the journal was full before every shard was owned
    done_s: float
    applied_before_owned: int
    workers_cpu_s: float | None  # from every shard owned to done, like the two below
    redis_cpu_s: float | None
    bench_cpu_s: float | None  # this process: the polling of leases and journal
    workers_cpu_total_s: float  # from worker start to done, like the one below
    redis_cpu_total_s: float
    direct: DirectRun

    @property
    def window_s(self) -> float:
        """From every shard owned until done."""
        return 0.0 if self.owned_s is None else self.done_s - self.owned_s

    @property
    def window_events(self) -> int:
        """Events applied from every shard owned until done."""
        return self.events - self.applied_before_owned

    @property
    def steady(self) -> bool:
        """Whether the owned-to-done window holds enough to measure: a tenth of the
        events at least."""
        return self.window_events > 0 and self.window_events * 10 >= self.events

    def per_event_ms(self, seconds: float | None) -> float | None:
        """``seconds`` spread over the events of the owned-to-done window, in ms."""
        return None if seconds is None or not self.steady else seconds / self.window_events * 1000

    @property
    def applied_per_s(self) -> float | None:
        """Events per second from every shard owned until done."""
        return self.window_events / self.window_s if self.steady else None

    @property
    def from_start_per_s(self) -> float:
        """Events per second from worker start until done."""
        return self.events / self.done_s

    @property
    def direct_per_s(self) -> float:
        """Events applied per second by the direct baseline."""
        return self.events / self.direct.elapsed_s

    def as_json(self) -> dict[str, Any]:
        """The numbers of this run."""
        per_s = self.applied_per_s

        def cores(seconds: float | None) -> float | None:
            return None if seconds is None or not self.steady else round(seconds / self.window_s, 2)

        def ms(seconds: float | None) -> float | None:
            value = self.per_event_ms(seconds)
            return None if value is None else round(value, 3)

        return {
            "workers": self.workers,
            "keys": self.keys,
            "applied_per_s": None if per_s is None else round(per_s, 1),
            "from_start_per_s": round(self.from_start_per_s, 1),
            "direct_per_s": round(self.direct_per_s, 1),
            "ratio": None if per_s is None else round(per_s / self.direct_per_s, 3),
            "owned_s": None if self.owned_s is None else round(self.owned_s, 3),
            "done_s": round(self.done_s, 3),
            "applied_before_owned": self.applied_before_owned,
            "workers_cpu_ms_per_event": ms(self.workers_cpu_s),
            "redis_cpu_ms_per_event": ms(self.redis_cpu_s),
            "direct_cpu_ms_per_event": round(self.direct.cpu_s / self.events * 1000, 3),
            "workers_cores": cores(self.workers_cpu_s),
            "redis_cores": cores(self.redis_cpu_s),
            "bench_cores": cores(self.bench_cpu_s),
            "workers_cpu_ms_per_event_from_start": round(
                self.workers_cpu_total_s / self.events * 1000, 3
            ),
            "redis_cpu_ms_per_event_from_start": round(
                self.redis_cpu_total_s / self.events * 1000, 3
            ),
        }


@dataclass
class Report:
    """Everything one benchmark invocation measured."""

    options: dict[str, Any]
    redis: dict[str, str]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...] = ()
    receiver: ReceiverResults = field(default_factory=ReceiverResults)
    e2e: list[E2eRun] = field(default_factory=list)
    drain: list[DrainRun] = field(default_factory=list)
    trickle: TrickleResults | None = None
    invariants: str = "not checked"

    def as_json(self) -> dict[str, Any]:
        """The one-line summary."""
        out: dict[str, Any] = {
            "bench": "keylane",
            **self.options,
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in self.load_before],
            "loadavg_after": [round(x, 2) for x in self.load_after],
            "redis": self.redis,
        }
        if self.receiver.rounds:
            out["receiver"] = self.receiver.as_json()
        if self.e2e:
            out["e2e"] = [run.as_json() for run in self.e2e]
        if self.drain:
            out["drain"] = [run.as_json() for run in self.drain]
        if self.trickle is not None:
            out["trickle"] = self.trickle.as_json()
        out["invariants"] = self.invariants
        return out

    def render(self) -> str:
        """The human-readable tables."""
        o = self.options
        lines = [
            f"keylane bench: {os.cpu_count()} CPUs, load average "
            f"{_loads(self.load_before)} before / {_loads(self.load_after)} after; "
            f"Redis {self.redis.get('version')} appendonly={self.redis.get('appendonly')} "
            f"appendfsync={self.redis.get('appendfsync')}; store {o['store']}",
        ]
        if self.e2e:
            lines.append(
                "note: (b)'s load generator (raw HTTP/1.1 on one asyncio loop, in this "
                "process) shares the CPUs with the servers: about 0.05 ms of CPU per request."
            )
        if self.receiver.rounds:
            lines += ["", *self.receiver.render(self.options)]
        if self.e2e:
            lines += ["", *self._render_e2e()]
        if self.drain:
            lines += ["", *self._render_drain()]
        if self.trickle is not None:
            lines += ["", *self.trickle.render()]
        checked = []
        if self.receiver.rounds:
            checked.append(
                "checked after each (a) round: every 2xx a keylane receiver sent (this tree's "
                "or another's, each in its own namespace) was counted by its accept script, "
                "and every event counted is in a shard queue"
            )
        if self.e2e:
            checked.append(
                "checked after (b): journal size, each record's sum and revision, per-record "
                "order against the answers seen, no dead letters, `keylane audit`"
            )
        if self.drain:
            checked.append(
                "checked after (c): journal size, each record's sum and revision, every event "
                "applied, each record's revisions in push order, no dead letters, "
                "`keylane audit`"
            )
        if self.trickle is not None:
            checked.append("checked after (d): journal size, each record's sum, no dead letters")
        if checked:
            lines += ["", *checked]
        lines += [f"invariants: {self.invariants}"]
        return "\n".join(lines)

    def _render_e2e(self) -> list[str]:
        o = self.options
        rows = []
        for run in self.e2e:
            j = run.as_json()
            rows.append(
                [
                    run.keys,
                    f"{j['applied_per_s']:.0f}",
                    f"{j['direct_per_s']:.0f}",
                    f"{j['ratio']:.2f}",
                    f"{j['accepted_per_s']:.0f}",
                    f"{j['drain_s']:.2f}",
                    f"{j['receiver_cpu_ms_per_event']:.2f}",
                    f"{j['workers_cpu_ms_per_event']:.2f}",
                    f"{j['direct_cpu_ms_per_event']:.2f}",
                    j["sender_retries"],
                ]
            )
        return [
            f"(b) end to end: {o['events']} events per row, {o['workers']} worker(s) x "
            f"{o['lanes']} lanes, {o['concurrency']} concurrent clients, store {o['store']}; "
            "direct = read, change, write in one thread on a fresh store, no Redis/HTTP",
            render_table(
                [
                    "keys",
                    "applied/s",
                    "direct/s",
                    "ratio",
                    "accepted/s",
                    "drain s",
                    "receiver cpu ms/ev",
                    "workers cpu ms/ev",
                    "direct cpu ms/ev",
                    "retries",
                ],
                rows,
            ),
        ]

    def _render_drain(self) -> list[str]:
        o = self.options
        rows = []
        for run in self.drain:
            j = run.as_json()
            rows.append(
                [
                    run.workers,
                    run.keys,
                    _num(j["applied_per_s"], ".0f"),
                    f"{j['direct_per_s']:.0f}",
                    _num(j["ratio"], ".2f"),
                    f"{j['from_start_per_s']:.0f}",
                    _num(j["owned_s"], ".2f"),
                    f"{j['done_s']:.2f}",
                    j["applied_before_owned"],
                    _num(j["workers_cpu_ms_per_event"], ".2f"),
                    _num(j["redis_cpu_ms_per_event"], ".3f"),
                    f"{j['direct_cpu_ms_per_event']:.2f}",
                    _num(j["workers_cores"], ".2f"),
                    _num(j["redis_cores"], ".2f"),
                ]
            )
        out = [
            f"(c) drain: {o['events']} events per row, queued beforehand (no HTTP), "
            f"{o['lanes']} lanes per worker, store {o['store']}.",
            "applied/s, cpu ms/ev and cores: from the moment every shard is owned (split "
            "settled) until the journal holds every event, events applied before excluded; "
            "from start/s: from starting the workers (boot and shard acquisition included); "
            "owned s, done s: seconds after starting the workers; direct = read, change, write in "
            "one thread on a fresh store; ratio = applied/s over direct/s",
            render_table(
                [
                    "workers",
                    "keys",
                    "applied/s",
                    "direct/s",
                    "ratio",
                    "from start/s",
                    "owned s",
                    "done s",
                    "before owned",
                    "workers cpu ms/ev",
                    "redis cpu ms/ev",
                    "direct cpu ms/ev",
                    "workers cores",
                    "redis cores",
                ],
                rows,
            ),
        ]
        if any(not run.steady for run in self.drain):
            out.append(
                "-: less than a tenth of the events was left when the split settled; more "
                "--events measure the steady rate"
            )
        return out

    def json_line(self) -> str:
        """The summary as one line of JSON."""
        return json.dumps(self.as_json(), separators=(",", ":"), sort_keys=False)


def _num(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _loads(values: tuple[float, ...]) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"
