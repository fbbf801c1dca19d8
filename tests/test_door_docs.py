"""The Deliveries page's example (ops/docs/deliveries.md, "An example") runs as written:
each command typed in the folder of the page's two files prints what the page shows."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.readme import page_text
from tests.support.senders import sender_deployment
from tests.support.stack import Stack, settings_env

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
DELIVERY_ID = re.compile(r"(?:forms|crm)/\d+-\d+")
SHARD = re.compile(r'"shard":\d+,"queue":"keylane\.shard\.\d+"')


def _blocks(text: str) -> list[tuple[str, str]]:
    """The code blocks of ``text``: (info string, body), in order."""
    chunks = [chunk.partition("\n") for chunk in text.split("```")[1::2]]
    return [(info.strip(), body) for info, _, body in chunks]


def _run(stack: Stack, cwd: Path, line: str, env: dict[str, str]) -> str:
    """A command line as typed (``NAME=VALUE ... keylane ARGS``): its output."""
    words = shlex.split(line, comments=True)
    assigned = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        assigned[name] = value
    assert words[0] == "keylane", line
    port = stack.url.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *words[1:]],
        cwd=cwd,
        env={**settings_env(stack.settings), **env, "KEYLANE_PORT": port, **assigned},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


def _normal(text: str) -> str:
    for pattern, into in ((TIMESTAMP, "T"), (DELIVERY_ID, "ID"), (SHARD, "S")):
        text = pattern.sub(into, text)
    return " ".join(text.split())


def _same(shown: list[str], got: list[str]) -> None:
    """``got`` is what the page shows, times, IDs, shards and column widths aside; a shown
    line ending in ``…`` is the start of the line."""
    assert len(got) == len(shown) or (shown and shown[-1].endswith("…")), (shown, got)
    for want, line in zip(shown, got, strict=False):
        want, line = _normal(want), _normal(line)
        if want.endswith("…"):
            assert line.startswith(want[:-1]), (want, line)
        else:
            assert line == want, (want, line)


def test_the_deliveries_page_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    # Given the page's sources file, its two bodies and its commands
    # (to the next section; page_section would take a "# " line of output for a heading)
    example = page_text("deliveries.md").split("\n## An example\n", 1)[1]
    blocks = _blocks(example.split("\n## Run again\n", 1)[0])
    (toml, sources), (_, contact), (_, no_key), (_, session) = blocks
    assert toml == "toml"
    (tmp_path / "contact.json").write_text(contact)
    (tmp_path / "no-key.json").write_text(no_key)
    lines = session.splitlines()
    secrets = {"FORMS_SECRET": "s3cret"}
    (tmp_path / "run").mkdir()
    with sender_deployment(redis_url, tmp_path / "run", sources, secrets) as stack:
        commands = [n for n, line in enumerate(lines) if not line.startswith("#")]
        first_id = ""
        for n, end in zip(commands, [*commands[1:], len(lines)], strict=True):
            # When each command is run as typed (the ID shown: the list's first)
            line = DELIVERY_ID.sub(first_id, lines[n]) if first_id else lines[n]
            got = _run(stack, tmp_path, line, secrets)
            if " deliveries list" in line:
                first_id = DELIVERY_ID.findall(got)[0]
            if os.environ.get("KEYLANE_SHOW_DOCS"):  # to write the page's output
                print(f"$ {line}\n{got}")
                continue
            # Then it prints what the page shows
            _same([x.removeprefix("# ") for x in lines[n + 1 : end]], got.splitlines())


def test_the_run_again_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    # Given the section's sources file, its body, and its two sessions of commands
    section = page_text("deliveries.md").split("\n## Run again\n", 1)[1]
    (toml, sources), (_, visit), (_, refused), (_, rerun) = _blocks(section)
    assert toml == "toml"
    (tmp_path / "visit.json").write_text(visit)
    secrets = {"CRM_SECRET": "s3cret"}
    (tmp_path / "run").mkdir()
    with sender_deployment(redis_url, tmp_path / "run", sources, secrets) as stack:
        # When the first is run with the wrong mapping, then the file is fixed as the page
        # says, and the second is run (each rerun after the one before it was applied)
        for session in (refused, rerun):
            lines = session.splitlines()
            commands = [n for n, line in enumerate(lines) if not line.startswith("#")]
            for n, end in zip(commands, [*commands[1:], len(lines)], strict=True):
                got = _run(stack, tmp_path, lines[n], secrets)
                if os.environ.get("KEYLANE_SHOW_DOCS"):
                    print(f"$ {lines[n]}\n{got}")
                else:  # Then each prints what the page shows
                    _same([x.removeprefix("# ") for x in lines[n + 1 : end]], got.splitlines())
                if lines[n].endswith("rerun --source crm"):
                    stack.wait_journal(1)
            if session is refused:
                fixed = stack.settings.sources_file
                assert fixed is not None
                fixed.write_text(fixed.read_text().replace("contact.idx", "contact.id"))
        # And the record has the one visit
        assert stack.open_store().read("contact:7").fields == {"visits": 1}
