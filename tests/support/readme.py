"""The examples of README and of the docs' pages (ops/docs/), for tests that run them as
written, read from the page itself; and the example CRM some of them talk to."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.services import free_port
from tests.support.stack import REPO, Stack, wait_until

DOCS = REPO / "ops" / "docs"


def page_text(page: str) -> str:
    """The Markdown of a docs page (``"destinations.md"``), or of ``"README.md"``."""
    return (REPO / page if page == "README.md" else DOCS / page).read_text()


def page_section(page: str, heading: str) -> str:
    """The part of ``page`` from the heading line ``heading`` (``"## Try it"``) to the
    next heading of the same level or above."""
    text = page_text(page)
    assert f"\n{heading}\n" in f"\n{text}", f"{page} has no heading {heading!r}"
    level = heading.split(" ", 1)[0]
    section = text.split(f"{heading}\n", 1)[1]
    for depth in range(1, len(level) + 1):
        section = section.split(f"\n{'#' * depth} ", 1)[0]
    return section


def _bodies(text: str) -> list[str]:
    """The code blocks of ``text``, fences and their info string excluded."""
    return [chunk.split("\n", 1)[1] for chunk in text.split("```")[1::2] if "\n" in chunk]


def page_block(page: str, first_line: str) -> str:
    """The text of ``page``'s one code block whose first line starts with ``first_line``."""
    found = [body for body in _bodies(page_text(page)) if body.startswith(first_line)]
    assert len(found) == 1, f"{len(found)} blocks of {page} start with {first_line!r}"
    return found[0]


def page_block_containing(page: str, marker: str) -> str:
    """The text of ``page``'s one code block that contains ``marker``."""
    found = [body for body in _bodies(page_text(page)) if marker in body]
    assert len(found) == 1, f"{len(found)} blocks of {page} contain {marker!r}"
    return found[0]


def readme_block(first_line: str) -> str:
    """README's one code block whose first line starts with ``first_line``."""
    return page_block("README.md", first_line)


def readme_block_containing(marker: str) -> str:
    """README's one code block that contains ``marker``."""
    return page_block_containing("README.md", marker)


def install_page_app(
    stack: Stack, tmp: Path, page: str, module: str, sources_line: str, **env: str
) -> None:
    """``page``'s app module (``"myapp.people"``: the block that starts ``# myapp/people.py``)
    and its sources file (the block that starts ``sources_line``) written as the page has
    them, for ``stack``'s next processes to import and read (``env`` for them too)."""
    package, name = module.split(".")
    (tmp / package).mkdir(exist_ok=True)
    (tmp / package / "__init__.py").write_text("")
    (tmp / package / f"{name}.py").write_text(page_block(page, f"# {package}/{name}.py"))
    sources = tmp / "sources.toml"
    sources.write_text(page_block(page, sources_line))
    stack.settings = stack.settings.model_copy(update={"sources_file": sources, "app": module})
    stack.extra_env.update(PYTHONPATH=f"{tmp}:{REPO}", **env)


def reader_env(port: int) -> dict[str, str]:
    """A reader's shell: keylane on PATH (as `source .venv/bin/activate` gives it), no
    keylane configuration but the receiver on ``port`` and free ports for the rest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        PYTHONPATH=str(REPO),
        KEYLANE_PORT=str(port),
        KEYLANE_FLOWER_PORT=str(free_port()),
        KEYLANE_OPS_PORT=str(free_port()),
    )
    return env


def keylane_command() -> list[str]:
    """The ``keylane`` command as a user runs it: the console script of this environment
    (its own folder, not the working directory, first on the import path); without one,
    the module with ``-P``, which leaves the working directory off the path the same way."""
    script = Path(sys.executable).with_name("keylane")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-P", "-m", "keylane.ops.cli"]


@contextmanager
def example_crm(line: str, log_path: Path) -> Iterator[str]:
    """The example CRM started by the docs' own command line (``python -m
    keylane.ops.examples.crm &``), on a free port instead of 8100; its API's URL, as
    ``CRM_URL``. Stopped on the way out."""
    argv = line.split("#", 1)[0].strip().removesuffix("&").split()
    assert argv[:3] == ["python", "-m", "keylane.ops.examples.crm"], line
    with log_path.open("wb") as log:
        crm = subprocess.Popen(
            [sys.executable, *argv[1:], "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: "example CRM on " in log_path.read_text() or crm.poll() is not None,
            30,
            "the example CRM to listen",
            on_timeout=log_path.read_text,
        )
        assert crm.poll() is None, log_path.read_text()
        yield log_path.read_text().split("example CRM on ", 1)[1].split()[0]
    finally:
        os.killpg(crm.pid, signal.SIGTERM)
        crm.wait(30)


def shell_commands(block: str) -> list[tuple[str, list[str]]]:
    """A page's shell block as a person types it: each command (a quoted argument or a
    here-document may span lines) with the ``# `` lines under it, which show what it
    prints."""
    commands: list[tuple[str, list[str]]] = []
    pending = ""
    for line in block.splitlines():
        if not pending and line.startswith("# "):
            commands[-1][1].append(line[2:])
            continue
        pending = f"{pending}\n{line}" if pending else line
        heredoc = re.search(r"<<'?(\w+)'?", pending)
        if heredoc and not pending.endswith(f"\n{heredoc.group(1)}"):
            continue  # a here-document goes on to its end marker
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        commands.append((pending, []))
        pending = ""
    return commands


def processes_in_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (a shell's, and what it left running)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone while read
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


@contextmanager
def pasted(block: str, cwd: Path, env: dict[str, str], logs: Path) -> Iterator[Path]:
    """``block`` pasted whole into a shell (bash reads it line by line from its input, as
    a terminal gives it) in ``cwd``; waits for the shell to end and gives the file its
    output went to (its errors to ``logs/stderr``). What the block left running in the
    background (``keylane up &``) is stopped on the way out as ``kill %1`` stops it:
    SIGTERM, then every process of the shell's group gone."""
    out, err = logs / "stdout", logs / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        shell = subprocess.Popen(
            ["bash"],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        assert shell.stdin is not None
        shell.stdin.write(block.encode())
        shell.stdin.close()
    try:
        assert shell.wait(300) == 0, out.read_text() + err.read_text()
        yield out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(30)
        wait_until(
            lambda: not processes_in_group(shell.pid), 90, "the stack to stop", err.read_text
        )
