"""ops/docs/dead-letters.md followed as a reader follows it: its set-up block pasted whole
into a shell (a sources file, `keylane up &`, the two deliveries that become review rows),
then each command of its console session typed, and what each prints compared with what
the page shows (ages and times aside)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.readme import (
    page_block,
    page_block_containing,
    pasted,
    reader_env,
    shell_commands,
)
from tests.support.services import free_port
from tests.support.stack import wait_until

pytestmark = pytest.mark.slow
PAGE = "dead-letters.md"


def _session(block: str) -> list[tuple[str, list[str]]]:
    """A console block: each ``$ `` command with the lines it prints."""
    typed: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            typed.append((line[2:], []))
        elif typed:
            typed[-1][1].append(line)
    return [(command, _trimmed(shown)) for command, shown in typed]


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _same(line: str) -> str:
    """A printed line without what changes from run to run: ages, times, column padding."""
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "TIME", line)
    line = re.sub(r"\b\d+(\.\d+)?s\b", "AGE", line)
    return " ".join(line.split())


def test_the_dead_letters_page_runs_as_written(tmp_path: Path) -> None:
    # Given a shell with keylane on PATH (as `source .venv/bin/activate` gives it), in a
    # folder of its own with no keylane configuration, the receiver on a free port
    port = free_port()
    env = reader_env(port)
    setup = page_block(PAGE, "cat > dlq-sources.toml")
    commands = shell_commands(setup)
    curls = [(c, shown) for c, shown in commands if c.startswith("curl ")]
    assert len(curls) == 2
    # When the page's set-up block is pasted whole
    with pasted(setup.replace("localhost:8000", f"localhost:{port}"), tmp_path, env, tmp_path):
        printed = (tmp_path / "stdout").read_text().splitlines()
        # Then each curl printed the outcome shown under it: dead-lettered, its review row
        answers = [json.loads(line) for line in printed if line.startswith('{"status"')]
        for (_, shown), answer in zip(curls, answers, strict=True):
            prefix = shown[0].removesuffix(",...}")
            assert json.dumps(answer, separators=(",", ":")).startswith(prefix), (answer, shown)
        # And each command of the session prints what the page shows under it
        session = _session(page_block_containing(PAGE, "$ keylane dlq list\n"))
        assert [c.split("  #")[0] for c, _ in session][:2] == [
            "keylane dlq list",
            "keylane dlq show 1",
        ]
        for command, shown in session:
            line = command.split("  #")[0]

            def run(line: str = line) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    ["bash", "-c", line],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )

            if line == "keylane records get contact:42":
                # (the retried event applies in its lane: a reader looks a moment later)
                wait_until(lambda: "revision 3" in run().stdout, 60, "the retry to apply")
            done = run()
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            got = _trimmed(done.stdout.splitlines())
            assert [_same(s) for s in got] == [_same(s) for s in shown], (command, got)
    # And the stack it started was the only one (nothing refused as "already running")
    assert "already running" not in (tmp_path / "stderr").read_text()
