"""Running one of the benchmarks (``ops/bench``) as a reader runs it: ``python -m`` from the
repository, its output kept for the test to read."""

from __future__ import annotations

import subprocess
import sys

from tests.support.stack import REPO


def run_bench(module: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` from the repository, its output captured (not checked)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
