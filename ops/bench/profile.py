"""Where the receiver's time goes under the benchmark's load: ``py-spy record`` (a sampling
profiler that attaches to a running process; ``pip install py-spy``) on the receiver during
one wrk round, its samples summed by area of the receiver.

Each sample (a stack) is given to the first area, read from the innermost frame outwards,
whose files it passes through: a sample inside redis-py called from the accept path is
"the accept script call"; one inside uvicorn's ``send`` called by the receiver's answer
is "HTTP server". The queue watch's background poll is its own area wherever its stack
goes (its Redis reads, its parsing of messages).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from .procs import BenchFailure

#: (area, path fragments of its frames), tried from the innermost frame outwards.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the accept script call (redis-py)", ("redis/",)),
    ("the Celery message (template, ids, base64)", ("contract/message.py",)),
    ("the event and its 202 answer", ("producers/accept.py",)),
    (
        "reading the delivery (body, JSON, checks, intake)",
        ("producers/body.py", "producers/intake.py", "contract/events.py", "contract/mapping.py"),
    ),
    ("signature check", ("producers/signatures/",)),
    ("the receiver's route and answer", ("producers/receiver.py", "contract/logcontext.py")),
    ("HTTP server and event loop (uvicorn, httptools, asyncio)", ("uvicorn/", "asyncio/")),
)
OTHER = "other"
QUEUE_WATCH = ("queue watch (one poll a second)", "producers/telemetry.py")


def find_py_spy() -> str:
    """The ``py-spy`` binary: on PATH or beside this interpreter."""
    beside = Path(sys.executable).parent / "py-spy"
    found = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if found is None:
        raise BenchFailure("--profile needs py-spy: pip install py-spy")
    return found


def start(py_spy: str, pid: int, duration_s: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample ``pid`` for ``duration_s`` (200 Hz) into ``out`` (collapsed stacks)."""
    argv = [py_spy, "record", "--format", "raw", "--rate", "200", "--nonblocking"]
    argv += ["--duration", str(duration_s), "--pid", str(pid), "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes], out: Path) -> list[tuple[str, float]]:
    """Wait for the profiler; each area's share of the samples, largest first."""
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    if not out.exists():
        raise BenchFailure(f"py-spy wrote no profile: {err.decode(errors='replace')[-2000:]}")
    return shares(out.read_text())


def shares(collapsed: str) -> list[tuple[str, float]]:
    """Each area's share of the samples in py-spy's collapsed stacks (``a;b;c N``)."""
    counts: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[area_of(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return [(area, count / total) for area, count in counts.most_common()]


def area_of(frames: list[str]) -> str:
    """The area of one sample (frames outermost first)."""
    area, fragment = QUEUE_WATCH
    if any(fragment in frame for frame in frames):
        return area
    for frame in reversed(frames):
        for area, fragments in AREAS:
            if any(fragment in frame for fragment in fragments):
                return area
    return OTHER
