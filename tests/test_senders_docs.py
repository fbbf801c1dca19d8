"""ops/docs/senders.md as written: its table names every preset with the defaults the code
gives it, and each worked example runs as the page shows it. Each example's request is
first checked to be signed as its sender signs (by the sender's SDK where it has one:
:mod:`tests.support.signers`), then its sources table and request are written to files
and its ``keylane sources try`` commands run in a shell, printing what the page prints.
The bad inputs the page lists each get the status and code it says."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from keylane.ops.captured import read_captured
from keylane.producers.handshakes import notion_token
from keylane.routing.contract.presets import PRESETS
from keylane.routing.contract.sources import parse_sources
from tests.support.readme import keylane_command, page_section, page_text
from tests.support.signers import SIGNERS, Outgoing, url_of

PAGE = "senders.md"
AT_OPTION = re.compile(r"--at (\d+)")
NO_HANDSHAKE = "\N{EN DASH}"


def blocks(text: str) -> list[tuple[str, str]]:
    """The code blocks of ``text`` as (info string, body), in order."""
    found = []
    for chunk in text.split("```")[1::2]:
        info, _, body = chunk.partition("\n")
        found.append((info.strip(), body))
    return found


def example_headings() -> list[str]:
    """The headings of the page's worked examples."""
    section = page_section(PAGE, "## Worked examples")
    return [line for line in section.splitlines() if line.startswith("### ")]


def table_rows() -> dict[str, list[str]]:
    """The page's table of senders by scheme name (a recipe by its name): its cells."""
    section = page_section(PAGE, "## Every sender")
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not cells[1].startswith("`"):
            continue
        for name in re.findall(r"`([a-z_0-9]+)`", cells[1]):
            rows[name] = cells
    return rows


# -- the table ----------------------------------------------------------------------------


def test_the_table_names_every_preset_with_its_defaults() -> None:
    # Given the page's table and the presets the code has
    rows = table_rows()
    # Then every preset is a row
    assert set(PRESETS) <= set(rows), sorted(set(PRESETS) - set(rows))
    for name, preset in PRESETS.items():
        _sender, _scheme, body, event_id, retention, handshake, _answer = rows[name][:7]
        # And its event id, retention and handshake are the code's
        assert f"`{preset.event_id}`" in event_id, (name, event_id)
        days = preset.retention_s / 86400
        assert retention.startswith(f"{days:g} d"), (name, retention)
        expected = NO_HANDSHAKE if preset.handshake is None else preset.handshake.title()
        assert expected in handshake, (name, handshake)
        # And its body format, when it names one
        if preset.body != "auto":
            assert preset.body in body.lower(), (name, body)


def example_sources() -> dict[str, str]:
    """Each worked example's source name and the scheme its table names."""
    found = {}
    for heading in example_headings():
        (toml,) = [body for info, body in blocks(page_section(PAGE, heading)) if info == "toml"]
        (source,) = parse_sources(toml).all()
        found[source.name] = str(source.verify.scheme)
    return found


def test_every_sender_of_the_table_has_a_worked_example() -> None:
    # Given the table's rows (presets and recipes) and the examples' sources
    examples = example_sources()
    # Then each row's sender has an example: a preset's by its scheme, a recipe's by its
    # name (HubSpot's v2 and v1 differ from v3 only in the header they sign, which
    # tests/test_signatures.py checks)
    for name in set(table_rows()) - {"hubspot_v2", "hubspot_v1"}:
        assert name in examples or name in examples.values(), name
    assert set(PRESETS) - {"hubspot_v2", "hubspot_v1"} <= set(examples.values())


# -- the worked examples ------------------------------------------------------------------


def _shell_env(environ: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if not k.startswith("KEYLANE_")}
    command = keylane_command()
    if len(command) == 1:  # the console script: its folder first on PATH, as installed
        env["PATH"] = f"{Path(command[0]).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _exports(script: str) -> dict[str, str]:
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ")
    )


def _public_url(script: str) -> str:
    found = re.search(r"KEYLANE_PUBLIC_URL=(\S+)", script)
    return found.group(1) if found else "https://hooks.example.com"


def _check_signed_as_the_sender_signs(scheme: str, request: str, script: str) -> None:
    """The page's request carries the headers its sender's own signer makes."""
    signer = SIGNERS.get(scheme)
    if signer is None:
        return  # a token, unsigned, or proof in the body: nothing computed to check
    captured = read_captured(request.encode())
    if captured.method == "GET" or notion_token(captured.headers, captured.body):
        return  # a GET handshake (Meta's, Mailchimp's) and Notion's are not signed
    found = AT_OPTION.search(script)
    at = int(found.group(1)) if found else 0
    secret = next(iter(_exports(script).values()))
    url = url_of(
        _public_url(script), captured.path, captured.query.decode() if captured.query else ""
    )
    out = Outgoing(captured.body, url, captured.method, captured.headers)
    for name, value in signer(secret, out, at).items():
        assert captured.headers.get(name.lower()) == value, (scheme, name)


LABEL = re.compile(r"`([\w.-]+)`:\s*$")


def labelled_blocks(text: str) -> list[tuple[str, str, str | None]]:
    """The code blocks of ``text`` as (info string, body, the file name the line before
    it gives: `` `name.http`: ``)."""
    chunks = text.split("```")
    found = []
    for position in range(1, len(chunks), 2):
        info, _, body = chunks[position].partition("\n")
        label = LABEL.search(chunks[position - 1])
        found.append((info.strip(), body, label.group(1) if label else None))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("heading", example_headings())
def test_each_worked_example_runs_as_written(heading: str, tmp_path: Path) -> None:
    # Given the example's sources table, requests, commands and outputs, as the page has them
    found = labelled_blocks(page_section(PAGE, heading))
    sources = [body for info, body, _ in found if info == "toml"]
    assert len(sources) == 1, heading
    (tmp_path / "sources.toml").write_text(sources[0])
    (source,) = parse_sources(sources[0]).all()
    scheme = str(source.verify.scheme)
    request: str | None = None
    ran = 0
    for position, (info, body, label) in enumerate(found):
        if info == "http":
            # (saved under the name the page gives it)
            assert label is not None, heading
            (tmp_path / label).write_text(body)
            request = body
        elif info == "sh":
            assert request is not None, heading
            # Then its request is signed as its sender signs it
            _check_signed_as_the_sender_signs(scheme, request, body)
            # When its commands run in a shell
            done = subprocess.run(
                ["bash", "-c", body],
                cwd=tmp_path,
                env=_shell_env(dict(os.environ)),
                capture_output=True,
                text=True,
                timeout=120,
            )
            # Then it prints what the page shows, and says so in its exit code
            shown_info, shown, _ = found[position + 1]
            assert shown_info == "text", heading
            assert done.stdout == shown, (heading, done.stdout, done.stderr)
            status = int(done.stdout.split("\n", 1)[0].rsplit(", ", 1)[1])
            assert done.returncode == (0 if status < 400 else 1), done.stderr
            request = None
            ran += 1
    assert ran >= 1, heading


# -- bad input ----------------------------------------------------------------------------

BAD_INPUTS = {
    "xml_bomb": (
        "text/xml",
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        b'<!ENTITY lol2 "&lol;&lol;&lol;">]><a>&lol2;</a>',
    ),
    "xml_external_entity": (
        "application/xml",
        b'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]><a>&x;</a>',
    ),
    "too_deep_form": ("application/x-www-form-urlencoded", b"a" + b"[b]" * 40 + b"=1"),
    "form_conflict": ("application/x-www-form-urlencoded", b"a=1&a[b]=2"),
    "multipart_no_boundary": ("multipart/form-data", b"--x\r\n\r\n"),
    "multipart_big_field": (
        "multipart/form-data; boundary=x",
        b'--x\r\nContent-Disposition: form-data; name="f"\r\n\r\n'
        + b"a" * ((1 << 20) + 1)
        + b"\r\n--x--\r\n",
    ),
    "too_many_items": ("application/json", json.dumps(list(range(1001))).encode()),
}


def bad_input_rows() -> dict[str, tuple[int, str]]:
    """The page's bad inputs: their name, status and code."""
    section = page_section(PAGE, "### What bad input gets")
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| .*?<!-- (\w+) --> \| `(\d{3}) (\w+)`", line)
        if found:
            rows[found.group(1)] = (int(found.group(2)), found.group(3))
    return rows


@pytest.mark.slow
def test_each_bad_input_gets_the_4xx_the_page_says(tmp_path: Path) -> None:
    # Given the page's list of bad inputs
    rows = bad_input_rows()
    assert set(rows) == set(BAD_INPUTS)
    (tmp_path / "sources.toml").write_text(
        '[sources.any]\nverify = { scheme = "none" }\nitems = "body:*"\nevent_id = "content-hash"\n'
    )
    for name, (content_type, body) in BAD_INPUTS.items():
        # When each is tried
        head = f"POST /webhooks/any HTTP/1.1\nContent-Type: {content_type}\n"
        head += f"Content-Length: {len(body)}\n\n"
        (tmp_path / f"{name}.http").write_bytes(head.encode() + body)
        done = subprocess.run(
            [*keylane_command(), "sources", "try", "any", "--request", f"{name}.http", "--json"],
            cwd=tmp_path,
            env={**_shell_env(dict(os.environ)), "KEYLANE_SOURCES_FILE": "sources.toml"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = json.loads(done.stdout)
        # Then it is refused with the status and code the page shows, and nothing else
        assert (report["status"], report["verdict"]) == rows[name], (name, report)
        assert done.returncode == 1


def test_the_page_s_commands_are_shell_words() -> None:
    # Given every sh block of the page: each line splits as a shell splits it (no
    # quoting a user would have to fix before pasting)
    for info, body in blocks(page_text(PAGE)):
        if info == "sh":
            for line in body.splitlines():
                shlex.split(line)
