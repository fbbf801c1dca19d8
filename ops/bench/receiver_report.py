"""Part (a)'s results: every round of every server and body kind, the best round of each,
the spread over rounds (min / median / max), and ratios read round by round: the servers
take turns within a round, so a round's two figures share the machine's load of that
moment, where the best of one and the best of the other may come from a quiet and a busy
minute."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tables import render_table
from .wrk import WrkResult

BASELINE = "baseline"
CURRENT = "keylane"


def key_of(server: str, body: str) -> str:
    """How the report names a server's runs with a body kind: ``keylane form``; the body
    left out for JSON (``keylane``, ``baseline``)."""
    return server if body == "json" else f"{server} {body}"


@dataclass(frozen=True)
class ReceiverRun:
    """One timed wrk run against one server (the baseline, this tree's receiver, or
    another revision's, named by its short hash) with one body kind, in one round."""

    name: str
    load: WrkResult
    server_cpu_s: float
    redis_cpu_s: float
    body: str = "json"
    round_no: int = 0

    @property
    def key(self) -> str:
        """Server and body kind, as the report names them (:func:`key_of`)."""
        return key_of(self.name, self.body)

    def per_request_ms(self, seconds: float) -> float:
        """``seconds`` spread over the requests answered, in milliseconds."""
        return seconds / max(1, self.load.requests) * 1000

    @property
    def server_cpu_ms(self) -> float:
        """The server's CPU per request, in milliseconds."""
        return self.per_request_ms(self.server_cpu_s)

    def as_json(self) -> dict[str, Any]:
        """The numbers of this run."""
        load = self.load
        return {
            "requests_per_s": round(load.per_s, 1),
            "p50_ms": round(load.p50_ms, 2),
            "p99_ms": round(load.p99_ms, 2),
            "errors": load.status_errors + load.socket_errors,
            "server_cpu_ms_per_req": round(self.server_cpu_ms, 4),
            "client_cpu_ms_per_req": round(self.per_request_ms(load.client_cpu_s), 4),
            "redis_cpu_ms_per_req": round(self.per_request_ms(self.redis_cpu_s), 4),
            "server_core_pct": round(100 * self.server_cpu_s / load.elapsed_s, 1),
            "client_core_pct": round(100 * load.client_cpu_s / load.elapsed_s, 1),
        }


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """Min, median and max of ``values``."""
    return min(values), statistics.median(values), max(values)


@dataclass(frozen=True)
class Ratio:
    """``top`` over ``bottom``, one value per round both ran in."""

    top: str
    bottom: str
    cpu: tuple[float, ...]  # server CPU per request
    per_s: tuple[float, ...]  # requests per second

    def as_json(self) -> dict[str, Any]:
        """Min, median and max of each."""
        return {
            "server_cpu_ms_per_req": [round(v, 3) for v in spread(self.cpu)],
            "requests_per_s": [round(v, 3) for v in spread(self.per_s)],
            "rounds": len(self.cpu),
        }


@dataclass
class ReceiverResults:
    """Everything part (a) measured, and what it left out and why."""

    rounds: list[ReceiverRun] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    profile: list[tuple[str, float]] = field(default_factory=list)

    def keys(self) -> list[str]:
        """Each server and body kind measured, in the order of the first round."""
        return list(dict.fromkeys(run.key for run in self.rounds))

    def runs_of(self, key: str) -> list[ReceiverRun]:
        """Every round of ``key``."""
        return [run for run in self.rounds if run.key == key]

    def best(self) -> dict[str, ReceiverRun]:
        """The round with the most requests per second, of each key."""
        return {key: max(self.runs_of(key), key=lambda r: r.load.per_s) for key in self.keys()}

    def ratio(self, top: str, bottom: str) -> Ratio | None:
        """``top`` over ``bottom`` round by round (None if they never shared a round)."""
        of_top = {run.round_no: run for run in self.runs_of(top)}
        pairs = [(of_top[b.round_no], b) for b in self.runs_of(bottom) if b.round_no in of_top]
        if not pairs or any(b.server_cpu_s <= 0 or b.load.per_s <= 0 for _t, b in pairs):
            return None
        return Ratio(
            top,
            bottom,
            tuple(t.server_cpu_ms / b.server_cpu_ms for t, b in pairs),
            tuple(t.load.per_s / b.load.per_s for t, b in pairs),
        )

    def ratios(self) -> list[Ratio]:
        """What the report compares: this tree against the baseline; against another
        revision, body kind by body kind; each other kind against JSON on this tree."""
        keys = self.keys()
        pairs = [(CURRENT, BASELINE)]
        pairs += [
            (key_of(CURRENT, run.body), run.key)
            for run in self.rounds
            if run.name not in (BASELINE, CURRENT)
        ]
        pairs += [
            (run.key, CURRENT) for run in self.rounds if run.name == CURRENT and run.body != "json"
        ]
        found = (self.ratio(t, b) for t, b in dict.fromkeys(pairs) if t in keys and b in keys)
        return [ratio for ratio in found if ratio is not None]

    def as_json(self) -> dict[str, Any]:
        """The best round of each key, then the spreads, ratios, skips and every round."""
        best = self.best()
        out: dict[str, Any] = {key: run.as_json() for key, run in best.items()}
        if CURRENT in best and BASELINE in best:
            out["ratio"] = round(best[CURRENT].load.per_s / best[BASELINE].load.per_s, 3)
        out["spread"] = {
            key: {
                "requests_per_s": [round(v, 1) for v in spread([r.load.per_s for r in runs])],
                "server_cpu_ms_per_req": [
                    round(v, 4) for v in spread([r.server_cpu_ms for r in runs])
                ],
                "p99_ms": [round(v, 2) for v in spread([r.load.p99_ms for r in runs])],
            }
            for key in best
            for runs in [self.runs_of(key)]
        }
        out["ratios"] = {f"{r.top}/{r.bottom}": r.as_json() for r in self.ratios()}
        if self.skipped:
            out["skipped"] = self.skipped
        out["rounds"] = [
            {"round": run.round_no + 1, "server": run.name, "body": run.body, **run.as_json()}
            for run in self.rounds
        ]
        if self.profile:
            out["profile"] = {area: round(f, 3) for area, f in self.profile}
        return out

    def render(self, options: dict[str, Any]) -> list[str]:
        """The tables and ratio lines people read."""
        rounds = options["rounds"]
        lines = [
            f"(a) receiver: wrk -t1 -c{options['concurrency']} -d{options['duration_s']}s, new "
            f"event ids over 1,024 record keys; {rounds} round(s), each server and body once "
            "a round, the order shifted by one each round",
            "body: json, form, multipart, xml are one event read by one mapped source; "
            "envelope is keylane's own (the demo source); the baseline is sent JSON",
            render_table(
                [
                    "round",
                    "server",
                    "body",
                    "requests/s",
                    "p50 ms",
                    "p99 ms",
                    "errors",
                    "server cpu ms/req",
                    "redis cpu ms/req",
                    "wrk cpu ms/req",
                    "server core%",
                ],
                [_round_row(run) for run in self.rounds],
            ),
            "",
            f"over the {rounds} round(s): requests/s of the best round, then min / median / max",
            render_table(
                [
                    "server",
                    "body",
                    "best requests/s",
                    "requests/s",
                    "server cpu ms/req",
                    "p99 ms",
                ],
                [self._spread_row(key, run) for key, run in self.best().items()],
            ),
        ]
        ratios = self.ratios()
        if ratios:
            lines += [
                "",
                "ratios round by round, median (min-max): server CPU per request; requests/s",
            ]
            lines += [
                f"  {r.top} / {r.bottom}: CPU {_spread_x(r.cpu)}; requests/s {_spread_x(r.per_s)}"
                for r in ratios
            ]
        lines += [f"skipped: {note}" for note in self.skipped]
        if self.profile:
            lines += ["", "(a) where keylane's receiver spends its time (py-spy, one more round):"]
            lines += [f"  {100 * f:5.1f} %  {area}" for area, f in self.profile]
        return lines

    def _spread_row(self, key: str, best: ReceiverRun) -> list[Any]:
        runs = self.runs_of(key)
        return [
            best.name,
            best.body,
            f"{best.load.per_s:.0f}",
            _spread_text([r.load.per_s for r in runs], ".0f"),
            _spread_text([r.server_cpu_ms for r in runs], ".3f"),
            _spread_text([r.load.p99_ms for r in runs], ".1f"),
        ]


def _round_row(run: ReceiverRun) -> list[Any]:
    j = run.as_json()
    return [
        run.round_no + 1,
        run.name,
        run.body,
        f"{j['requests_per_s']:.0f}",
        f"{j['p50_ms']:.1f}",
        f"{j['p99_ms']:.1f}",
        j["errors"],
        f"{j['server_cpu_ms_per_req']:.3f}",
        f"{j['redis_cpu_ms_per_req']:.3f}",
        f"{j['client_cpu_ms_per_req']:.3f}",
        f"{j['server_core_pct']:.0f}",
    ]


def _spread_text(values: Sequence[float], spec: str) -> str:
    return " / ".join(format(v, spec) for v in spread(values))


def _spread_x(values: Sequence[float]) -> str:
    low, mid, high = spread(values)
    return f"{mid:.2f}x ({low:.2f}-{high:.2f})"
