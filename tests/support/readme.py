"""README's own examples, for tests that run them as written."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.stack import REPO


def readme_block(first_line: str) -> str:
    """The text of README's code block whose first line starts with ``first_line``
    (fences excluded); fails when there is not exactly one."""
    readme = (REPO / "README.md").read_text()
    blocks = [chunk.split("```", 1)[0] for chunk in readme.split("```")[1::2]]
    bodies = [block.split("\n", 1)[1] if "\n" in block else "" for block in blocks]
    found = [body for body in bodies if body.startswith(first_line)]
    assert len(found) == 1, f"{len(found)} README blocks start with {first_line!r}"
    return found[0]


def readme_block_containing(marker: str) -> str:
    """The text of README's one code block that contains ``marker`` (fences excluded)."""
    readme = (REPO / "README.md").read_text()
    blocks = [chunk.split("\n", 1)[1] for chunk in readme.split("```")[1::2] if "\n" in chunk]
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"{len(found)} README blocks contain {marker!r}"
    return found[0]


def keylane_command() -> list[str]:
    """The ``keylane`` command as a user runs it: the console script of this environment
    (its own folder, not the working directory, first on the import path); without one,
    the module with ``-P``, which leaves the working directory off the path the same way."""
    script = Path(sys.executable).with_name("keylane")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-P", "-m", "keylane.ops.cli"]
