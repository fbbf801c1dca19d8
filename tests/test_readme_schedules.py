"""The "Scheduled syncs and repairs" example of ops/docs/schedules.md, run as written: its
``myapp/jobs.py`` imported by ``keylane up``, its commands run one by one, against a CRM
served here (the three contacts the example CRM, ops/examples/crm.py, starts with)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.readme import page_text
from tests.support.services import free_port
from tests.support.stack import REPO, start_up, wait_until

pytestmark = pytest.mark.slow

CONTACTS = [
    {"id": 1, "email": "ada@Analytical.example", "name": "Ada", "company": "Analytical"},
    {"id": 2, "email": "grace@navy.example", "name": "Grace", "company": "Navy"},
    {"id": 3, "email": "edsger", "name": "Edsger", "company": "THE"},
]


def _blocks() -> tuple[str, list[str]]:
    section = page_text("schedules.md")
    python = re.search(r"```python\n(# myapp/jobs.py\n.*?)```", section, re.S)
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    assert python is not None
    assert sh is not None
    return python.group(1), sh.group(1).splitlines()


class _Crm(BaseHTTPRequestHandler):
    asked: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        assert url.path == "/api/contacts"
        self.asked.append(parse_qs(url.query))
        body = json.dumps({"results": CONTACTS}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def crm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Crm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def test_the_readme_example_runs_as_written(tmp_path: Path, crm: str) -> None:
    # Given the page's myapp/jobs.py, and its shell lines
    code, lines = _blocks()
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(code)
    commands = [line.split("  #")[0].strip() for line in lines if line.strip()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env.update(PYTHONPATH=f"{tmp_path}:{REPO}", KEYLANE_DATA_DIR=str(tmp_path / "data"))
    export = commands.pop(0)
    assert export.startswith("export ")
    for assignment in shlex.split(export)[1:]:
        name, value = assignment.split("=", 1)
        env[name] = crm if name == "CRM_URL" else value  # the CRM is the test's
    assert commands[0] == "keylane up"
    # When `keylane up` starts (on a free port, without Flower)
    port = free_port()
    up_args = ["up", "--port", str(port), "--no-flower"]
    up = start_up(up_args, env, tmp_path / "up.log")
    try:

        def keylane(command: str) -> subprocess.CompletedProcess[str]:
            argv = shlex.split(command)
            assert argv[0] == "keylane"
            return subprocess.run(
                [sys.executable, "-m", "keylane.ops.cli", *argv[1:]],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )

        def json_of(command: str) -> object:
            done = keylane(command)
            # `records get` exits 1 for a record not written yet, and still prints it
            ok = (0, 1) if command.startswith("keylane records get") else (0,)
            assert done.returncode in ok, done.stdout + done.stderr
            return json.loads(done.stdout)

        wait_until(
            lambda: (
                {s["job"] for s in json_of("keylane schedules --json")}  # type: ignore[attr-defined]
                >= {"fill_domain", "pull_changed_contacts", "keylane.journal-prune"}
            ),
            120,
            "the scheduler to register both jobs and the prune",
            on_timeout=(tmp_path / "up.log").read_text,
        )
        # Then each command of the example runs and does what it says
        outputs = {}
        for command in commands[1:]:
            done = keylane(command)
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            outputs[command] = done.stdout
            if command.startswith("keylane run"):  # the sync's events reach the records
                # (at least once: the job runs every 5 minutes, and when `keylane up` starts
                # just before a multiple of 5 its own tick sends the same contacts too, each
                # applied once more with the same fields: revision 2)
                wait_until(
                    lambda: all(
                        json_of(f"keylane records get contact:{c['id']} --json")["revision"]  # type: ignore[index]
                        >= 1
                        for c in CONTACTS
                    ),
                    180,
                    "the contacts to be applied",
                    on_timeout=(tmp_path / "up.log").read_text,
                )
        assert "pull_changed_contacts" in outputs["keylane schedules"]
        assert "keylane.journal-prune  every 600s" in outputs["keylane schedules"]
        assert "3 event(s) sent" in outputs["keylane run pull_changed_contacts"]
        assert "2 record(s) to repair" in outputs["keylane repair fill_domain --dry-run"]
        assert "2 event(s) sent" in outputs["keylane repair fill_domain"]

        def domains() -> list[object]:
            return [
                json_of(f"keylane records get contact:{c['id']} --json")["fields"].get("domain")  # type: ignore[index]
                for c in CONTACTS
            ]

        wait_until(
            lambda: domains() == ["analytical.example", "navy.example", None],
            180,
            "the repairs to be applied",
            on_timeout=(tmp_path / "up.log").read_text,
        )
        listed = {s["job"]: s for s in json_of("keylane schedules --json")}  # type: ignore[attr-defined]
        assert listed["fill_domain"]["timing"] == "cron 0 3 * * * (Europe/Paris)"
        assert listed["fill_domain"]["next_run"].endswith(("T01:00:00Z", "T02:00:00Z"))
        assert listed["pull_changed_contacts"]["next_run"][14:19] in {
            f"{m:02d}:00" for m in range(0, 60, 5)
        }
        assert _Crm.asked[0] == {}  # the first run asks for everything (no `since` yet)
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    assert code == 0, (tmp_path / "up.log").read_text()
