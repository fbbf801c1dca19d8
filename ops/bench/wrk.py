"""The receiver benchmark's load generator: ``wrk`` (C, one event loop per thread), so the
load costs a small share of a core and the server under test is the limit.

Each request carries a new event id (``<tag>-<thread>-<n>``) and one of 1,024 record keys,
in one of the body kinds of :mod:`keylane.ops.bench.bodies` (keylane's own envelope unless
asked otherwise): every request is a first delivery, none a duplicate. wrk's Lua ``done``
hook prints the figures as one JSON line, read here; wrk's own CPU time is read from the
kernel when it exits. wrk is Debian's and Ubuntu's package ``wrk``:
:func:`ensure_wrk` installs it with ``apt-get`` when it is absent and the benchmark runs
as root, and otherwise says how to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .bodies import lua_of
from .procs import BenchFailure, say

#: Marks the line that wrk's ``done`` hook prints.
RESULT_MARK = "KEYLANE_WRK "

# Lua run by wrk after a body kind's headers and body(id, key): unique event ids per
# thread and request, figures printed as JSON.
SCRIPT = r"""
local tag = "bench"
local threads = {}
local next_thread = 0

function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local n = 0
function init(args)
  tag = (args[1] or "bench") .. "-" .. tostring(tid)
end

function request()
  n = n + 1
  return wrk.format("POST", nil, headers, body(tag .. "-" .. n, tag .. "." .. n % 1024))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"status_errors": %d, "socket_errors": %d}\n',
    "KEYLANE_WRK ", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: requests answered, over how long, latency percentiles, errors, and
    the CPU wrk itself used."""

    requests: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    status_errors: int  # answers that were not 2xx or 3xx
    socket_errors: int
    client_cpu_s: float

    @property
    def per_s(self) -> float:
        """Requests answered per second."""
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def answered_2xx(self) -> int:
        """Requests answered 2xx (or 3xx)."""
        return self.requests - self.status_errors


def ensure_wrk() -> str:
    """The path of ``wrk``, installed with ``apt-get`` first if it is absent and this
    process may (root on a Debian-like system); :class:`BenchFailure` otherwise."""
    found = shutil.which("wrk")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise BenchFailure(
            "the receiver benchmark needs wrk: install it (Debian/Ubuntu: apt-get install wrk)"
        )
    say("wrk is absent: apt-get install -y wrk")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "wrk"]
    # A fresh machine may have no package lists yet: update once, then try again.
    for argv in (install, [apt, "update", "-q"], install):
        if shutil.which("wrk"):
            break
        subprocess.run(argv, env=env, capture_output=True, check=False, timeout=600)
    found = shutil.which("wrk")
    if not found:
        raise BenchFailure("apt-get could not install wrk; install it by hand")
    return found


def script_of(body: str) -> str:
    """wrk's whole Lua script for requests of body kind ``body``."""
    return lua_of(body) + SCRIPT


def run_wrk(
    wrk: str,
    url: str,
    tag: str,
    connections: int,
    duration_s: int,
    threads: int = 1,
    body: str = "envelope",
) -> WrkResult:
    """``wrk -t THREADS -c CONNECTIONS -d DURATION --latency`` POSTing new events to
    ``url``, each a body of kind ``body``; event ids start with ``tag`` (a new tag per run
    keeps every id new)."""
    with tempfile.TemporaryDirectory(prefix="klwrk-") as tmp:
        script = Path(tmp) / "events.lua"
        script.write_text(script_of(body))
        argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency"]
        argv += ["-s", str(script), url, "--", tag]
        out_path = Path(tmp) / "out.txt"
        with out_path.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            started = time.monotonic()
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        text = out_path.read_text(errors="replace")
    if proc.returncode != 0 or RESULT_MARK not in text:
        took_s = time.monotonic() - started
        raise BenchFailure(f"wrk exited {proc.returncode} after {took_s:.0f}s:\n{text}")
    line = next(ln for ln in text.splitlines() if ln.startswith(RESULT_MARK))
    data = json.loads(line[len(RESULT_MARK) :])
    return WrkResult(
        requests=int(data["requests"]),
        elapsed_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        status_errors=int(data["status_errors"]),
        socket_errors=int(data["socket_errors"]),
        client_cpu_s=usage.ru_utime + usage.ru_stime,
    )
