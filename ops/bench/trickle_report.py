"""Part (d)'s figures, a trickle (:mod:`keylane.ops.bench.trickle`): what each event
costs in Redis commands and CPU by process, the idle cost beside it, as a table people
read and as JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..tables import render_table

#: The processes whose CPU is measured.
ROLES = ("receiver", "worker", "redis")
#: Commands shown by name in the by-command table (the most per event at any rate).
TOP_COMMANDS = 14


@dataclass(frozen=True)
class Pace:
    """What (d) sends: each rate, events per second, for ``seconds``."""

    rates: tuple[float, ...] = (10.0, 50.0, 200.0)
    seconds: float = 20.0


@dataclass(frozen=True)
class Usage:
    """What was used over a window: Redis commands by name, CPU seconds by process."""

    seconds: float
    commands: Counter[str]
    cpu_s: dict[str, float]

    @property
    def total_commands(self) -> int:
        """Every command the server ran (those inside scripts too)."""
        return sum(self.commands.values())

    def per_s(self, count: float) -> float:
        """``count`` over this window's seconds."""
        return count / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class TrickleRun:
    """One rate's trickle: ``events`` sent one at a time, measured from the first send
    until the journal held them all."""

    rate: float
    events: int
    sent_per_s: float
    p99_accept_ms: float
    window: Usage

    def commands_per_event(self, idle: Usage | None = None, command: str | None = None) -> float:
        """Redis commands per event (of one ``command``, or all), less what ``idle`` ran
        in as long when given."""

        def count(use: Usage) -> float:
            return use.commands[command] if command else use.total_commands

        spent = count(self.window)
        if idle is not None:
            spent -= idle.per_s(count(idle)) * self.window.seconds
        return spent / self.events

    def cpu_ms_per_event(self, role: str, idle: Usage | None) -> float:
        """CPU ms per event of ``role``, less its idle CPU for as long."""
        spent = self.window.cpu_s[role]
        if idle is not None:
            spent -= idle.per_s(idle.cpu_s[role]) * self.window.seconds
        return spent / self.events * 1000

    def as_json(self, idle: Usage | None) -> dict[str, Any]:
        """This rate's numbers."""
        cpu = {role: round(self.cpu_ms_per_event(role, idle), 3) for role in ROLES}
        return {
            "rate_per_s": self.rate,
            "events": self.events,
            "sent_per_s": round(self.sent_per_s, 1),
            "window_s": round(self.window.seconds, 2),
            "redis_commands_per_event": round(self.commands_per_event(), 2),
            "redis_commands_per_event_less_idle": round(self.commands_per_event(idle), 2),
            "commands_per_event": {
                name: round(n / self.events, 3) for name, n in self.window.commands.most_common()
            },
            "cpu_ms_per_event_less_idle": {**cpu, "total": round(sum(cpu.values()), 3)},
            "p99_accept_ms": round(self.p99_accept_ms, 2),
        }


@dataclass
class TrickleResults:
    """Part (d): the idle cost and each rate's run."""

    store: str
    keys: int
    seconds: float
    redis: dict[str, str]
    idle: Usage | None = None
    runs: list[TrickleRun] = field(default_factory=list)
    invariants: str = "not checked"

    def as_json(self) -> dict[str, Any]:
        """The numbers of part (d)."""
        out: dict[str, Any] = {"keys": self.keys, "seconds": self.seconds, "redis": self.redis}
        if self.idle is not None:
            idle = self.idle
            out["idle"] = {
                "seconds": round(idle.seconds, 2),
                "redis_commands_per_s": round(idle.per_s(idle.total_commands), 1),
                "commands_per_s": {
                    name: round(idle.per_s(n), 2) for name, n in idle.commands.most_common()
                },
                "cpu_ms_per_s": {r: round(idle.per_s(idle.cpu_s[r]) * 1000, 2) for r in ROLES},
            }
        out["runs"] = [run.as_json(self.idle) for run in self.runs]
        out["invariants"] = self.invariants
        return out

    def render(self) -> list[str]:
        """The two tables: per rate, and Redis commands per event by name."""
        lines = [
            f"(d) trickle: one receiver and one worker at their defaults, a Redis server of "
            f"their own (Redis {self.redis.get('version')}, appendonly="
            f"{self.redis.get('appendonly')}, appendfsync={self.redis.get('appendfsync')}), "
            f"store {self.store}; events sent one at a time over {self.keys} keys, each "
            f"answered 202 before the next, for {self.seconds:g} s per rate; measured from the "
            "first send until the journal holds every event (+1 s); CPU less the idle cost",
        ]
        idle = self.idle
        if idle is not None:
            top = ", ".join(
                f"{name} {idle.per_s(n):.1f}" for name, n in idle.commands.most_common(6)
            )
            cpu = ", ".join(f"{r} {idle.per_s(idle.cpu_s[r]) * 1000:.1f}" for r in ROLES)
            lines.append(
                f"idle: {idle.per_s(idle.total_commands):.1f} Redis commands/s ({top}); "
                f"CPU ms/s: {cpu}"
            )
        rows = []
        for run in self.runs:
            ms = [run.cpu_ms_per_event(role, idle) for role in ROLES]
            rows.append(
                [
                    f"{run.rate:g}",
                    f"{run.sent_per_s:.1f}",
                    run.events,
                    f"{run.commands_per_event():.1f}",
                    f"{run.commands_per_event(idle):.1f}",
                    *(f"{v:.2f}" for v in ms),
                    f"{sum(ms):.2f}",
                    f"{run.p99_accept_ms:.1f}",
                ]
            )
        headers = ["rate/s", "sent/s", "events", "redis cmds/ev", "less idle"]
        headers += [f"{role} cpu ms/ev" for role in ROLES]
        lines.append(render_table([*headers, "total cpu ms/ev", "p99 accept ms"], rows))
        lines += ["", *self._render_commands()]
        return lines

    def _render_commands(self) -> list[str]:
        """Redis commands per event by name, the most at any rate first."""
        most: dict[str, float] = {}
        for run in self.runs:
            for name, n in run.window.commands.items():
                most[name] = max(most.get(name, 0.0), n / run.events)
        names = sorted(most, key=lambda name: -most[name])[:TOP_COMMANDS]
        rows: list[list[object]] = []
        for name in [*names, ""]:
            row: list[object] = [name or "(others)"]
            if self.idle is not None:
                idle = self.idle
                n = idle.commands[name] if name else _others(idle.commands, names)
                row.append(f"{idle.per_s(n):.1f}")
            for run in self.runs:
                n = run.window.commands[name] if name else _others(run.window.commands, names)
                row.append(f"{n / run.events:.2f}")
            rows.append(row)
        headers = ["command", *(["idle/s"] if self.idle is not None else [])]
        headers += [f"per ev @{run.rate:g}/s" for run in self.runs]
        return ["Redis commands per event by name (idle included)", render_table(headers, rows)]


def _others(commands: Counter[str], shown: list[str]) -> int:
    return sum(n for name, n in commands.items() if name not in shown)
