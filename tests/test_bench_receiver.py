"""The receiver benchmark's pieces that need no long run (:mod:`keylane.ops.bench.bodies`,
:mod:`keylane.ops.bench.receiver_report`, :mod:`keylane.ops.bench.trees`): wrk's Lua
makes bodies of every kind that keylane's own receiver reads as the event they carry;
the ratios are read round by round; another revision is found, unpacked and installed
as its own lock says."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from keylane.ops.bench import trees
from keylane.ops.bench.__main__ import main
from keylane.ops.bench.bodies import KINDS, SOURCES, source_of
from keylane.ops.bench.procs import REPO, BenchFailure
from keylane.ops.bench.receiver_report import ReceiverResults, ReceiverRun
from keylane.ops.bench.wrk import WrkResult, run_wrk
from keylane.producers.formats import format_of, read_tree
from keylane.producers.receiver_app import create_receiver
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.sources import parse_sources
from tests.support.http_server import serving

#: The release 0.1.0.
RELEASE = "44bfee1"


class _Capture(BaseHTTPRequestHandler):
    """Answers 202 to every POST and keeps the first bodies it is sent."""

    protocol_version = "HTTP/1.1"
    kept: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if len(self.kept) < 20:
            self.kept.append((self.headers["content-type"], body))
        self.send_response(202)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def capture() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    kept: list[tuple[str, bytes]] = []
    with serving(type("Handler", (_Capture,), {"kept": kept})) as url:
        yield f"{url}/", kept


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
def test_wrk_makes_bodies_of_each_kind_that_the_receiver_reads_as_their_event(
    kind: str, capture: tuple[str, list[tuple[str, bytes]]], settings: Settings
) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    # Given the requests wrk makes for one kind, captured by a plain HTTP server
    url, kept = capture
    run_wrk("wrk", url, "t7", 1, 1, body=kind)
    assert len(kept) == 20
    # When keylane's receiver, with the bench's sources, is sent each of them
    app = create_receiver(settings, parse_sources(SOURCES), environ={})
    with TestClient(app, raise_server_exceptions=True) as client:
        answers = [
            client.post(
                f"/webhooks/{source_of(kind)}", content=body, headers={"content-type": media}
            )
            for media, body in kept
        ]
    # Then each is a new event: its id made by wrk, its record one of 1,024 keys
    assert [a.status_code for a in answers] == [202] * 20, answers[0].text
    ids = [a.json()["event_id"] for a in answers]
    assert len(set(ids)) == 20
    assert all(i.startswith("t7-0-") for i in ids)
    keys = [f"t7-0.{int(i.rsplit('-', 1)[1]) % 1024}" for i in ids]
    assert [a.json()["record_key"] for a in answers] == [f"bench:{k}" for k in keys]
    # And every kind but the envelope is the same tree in keylane's own parsers
    if kind != "envelope":
        media, body = kept[0]
        assert format_of(media) == kind
        assert read_tree(body, media, kind) == {"event": {"id": ids[0], "key": keys[0]}}


def _run(name: str, body: str, round_no: int, per_s: float, cpu_ms: float) -> ReceiverRun:
    """A run of 1,000 requests at ``per_s`` whose server used ``cpu_ms`` per request."""
    load = WrkResult(1000, 1000 / per_s, 1.0, 5.0, 0, 0, 0.05)
    return ReceiverRun(name, load, cpu_ms, 0.01, body, round_no)


def test_the_ratios_are_read_round_by_round_and_spread_over_the_rounds() -> None:
    # Given three rounds (requests/s, server CPU ms per request) of this tree, another
    # revision and the baseline with JSON, and of this tree with forms; the other
    # revision's forms left out
    figures = {
        ("baseline", "json"): [(1000, 0.1), (500, 0.2), (800, 0.15)],
        ("keylane", "json"): [(500, 0.2), (250, 0.4), (400, 0.3)],
        ("ff333c5", "json"): [(400, 0.25), (250, 0.4), (250, 0.5)],
        ("keylane", "form"): [(450, 0.22), (200, 0.48), (400, 0.33)],
    }
    results = ReceiverResults(skipped=["ff333c5 form: refused"])
    for round_no in range(3):
        results.rounds += [
            _run(name, body, round_no, *runs[round_no]) for (name, body), runs in figures.items()
        ]
    # When the report reads them
    found = results.as_json()
    # Then each ratio is taken within a round, and spread min / median / max over them
    ratios = found["ratios"]
    assert list(ratios) == ["keylane/baseline", "keylane/ff333c5", "keylane form/keylane"]
    assert ratios["keylane/ff333c5"]["server_cpu_ms_per_req"] == [0.6, 0.8, 1.0]
    assert ratios["keylane/ff333c5"]["requests_per_s"] == [1.0, 1.25, 1.6]
    assert ratios["keylane form/keylane"]["server_cpu_ms_per_req"] == [1.1, 1.1, 1.2]
    assert ratios["keylane/baseline"]["server_cpu_ms_per_req"] == [2.0, 2.0, 2.0]
    assert ratios["keylane/baseline"]["rounds"] == 3
    # And each key's own figures are spread too, its best round shown
    assert found["spread"]["ff333c5"]["server_cpu_ms_per_req"] == [0.25, 0.4, 0.5]
    assert found["spread"]["keylane"]["requests_per_s"] == [250.0, 400.0, 500.0]
    assert found["keylane"]["requests_per_s"] == 500.0
    assert found["ratio"] == 0.5
    assert found["skipped"] == ["ff333c5 form: refused"]
    assert [(r["round"], r["server"], r["body"]) for r in found["rounds"][:2]] == [
        (1, "baseline", "json"),
        (1, "keylane", "json"),
    ]
    text = "\n".join(results.render({"rounds": 3, "concurrency": 32, "duration_s": 15}))
    assert "keylane / ff333c5: CPU 0.80x (0.60-1.00); requests/s 1.25x (1.00-1.60)" in text
    assert "skipped: ff333c5 form: refused" in text


def test_a_revision_is_cached_by_its_full_hash_and_installed_from_its_own_lock(
    tmp_path: Path,
) -> None:
    # Given the release's short hash
    commit = trees.resolve(RELEASE)
    assert len(commit) == 40
    assert commit.startswith(RELEASE)
    assert trees.resolve(commit) == commit
    # Then its files and venv are kept under its full hash
    root, venv = trees.cache_of(commit, tmp_path)
    assert (root, venv) == (tmp_path / commit / "tree", tmp_path / commit / "venv")
    # And its venv is built from its own lock, hashes required, keylane without deps
    argvs = trees.install_argvs("/usr/bin/python3", root, venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    assert argvs == [
        ["/usr/bin/python3", "-m", "venv", str(venv)],
        [*pip, "install", "--require-hashes", "-r", str(root / "ops/requirements-dev.txt")],
        [*pip, "install", "--no-deps", "--no-build-isolation", str(root)],
    ]
    # And it is served by its venv's python
    tree = trees.Tree(commit, root, venv)
    assert tree.label == RELEASE
    assert tree.keylane_argv("serve")[:3] == [str(venv / "bin" / "python"), "-m", "keylane.ops.cli"]


def test_a_name_that_is_no_commit_is_refused() -> None:
    with pytest.raises(BenchFailure, match="not a commit"):
        trees.resolve("no-such-revision-anywhere")


def test_a_revision_is_unpacked_from_the_repository_history(tmp_path: Path) -> None:
    # When the release is unpacked
    commit = trees.resolve(RELEASE)
    root = tmp_path / "tree"
    trees.unpack(commit, root)
    # Then its files are the revision's, its keylane/ links kept, nothing left beside it
    shown = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:ops/requirements-dev.txt"],
        capture_output=True,
        check=True,
    ).stdout
    assert (root / "ops/requirements-dev.txt").read_bytes() == shown
    assert (root / "keylane" / "ops").is_symlink()
    assert (root / "keylane" / "ops" / "cli.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


def test_every_command_of_the_benchmarks_page_parses_and_names_a_revision_there_is() -> None:
    # Given each `python -m keylane.ops.bench ...` line of the benchmarks page
    page = (REPO / "ops" / "docs" / "benchmarks.md").read_text()
    commands = [
        shlex.split(line, comments=True)
        for line in re.findall(r"^python -m keylane\.ops\.bench (.+)$", page, re.M)
    ]
    assert any("--against" in argv for argv in commands)
    assert any("--body" in argv for argv in commands)
    for argv in commands:
        # Then the benchmark's options read it as written
        with main.make_context("bench", list(argv)) as ctx:
            against = ctx.params["against"]
            # And the revision it names is one of this repository's
            if against is not None:
                assert len(trees.resolve(against)) == 40
