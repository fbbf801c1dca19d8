"""The Web view page (ops/docs/web-view.md) as written: `keylane up` prints the lines it
shows, the view is at the URL it names, and each shareable URL it gives shows what it
says (ports aside: tests run side by side)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.support.readme import page_block
from tests.support.services import free_port
from tests.support.stack import REPO, start_up, wait_until

PAGE = "web-view.md"


def _ids(html: str, pattern: str) -> list[str]:
    return re.findall(pattern, html)


def test_the_web_view_page_runs_as_written(redis_url: str, namespace: str, tmp_path: Path) -> None:
    # Given the page's `keylane up` and what it prints, and its shareable URLs
    up_block = page_block(PAGE, "keylane up\n")
    command, *shown = up_block.splitlines()
    urls = page_block(PAGE, "http://127.0.0.1:8100/dead-letters?reason=type").splitlines()
    # and a reader's machine: no configuration but its own ports (and the test's Redis)
    # (its operations listener on a free port start_up picks, read back from what it prints)
    port, flower_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")} | {
        "PYTHONPATH": str(REPO),
        "KEYLANE_DATA_DIR": str(tmp_path / "data"),
        "KEYLANE_REDIS_URL": redis_url,
        "KEYLANE_NAMESPACE": namespace,
        "KEYLANE_PORT": str(port),
        "KEYLANE_FLOWER_PORT": str(flower_port),
    }
    ports = {"8000": str(port), "5555": str(flower_port)}

    def here(text: str) -> str:
        return re.sub(r":(8000|8100|5555)\b", lambda m: f":{ports[m.group(1)]}", text)

    # When `keylane up` is run as the page shows
    assert command == "keylane up"
    log = tmp_path / "up.log"
    up = start_up(["up"], env, log, cwd=tmp_path)
    try:
        # Then it prints the page's lines, the web view's URL among them
        wait_until(lambda: "Flower:" in log.read_text(), 30, "the banner", on_timeout=log.read_text)
        printed = log.read_text().splitlines()
        ops = re.search(r"^Web view: http://127\.0\.0\.1:(\d+)/$", log.read_text(), re.M)
        assert ops is not None, printed
        ports["8100"] = ops.group(1)
        for line in shown:
            assert here(line.removeprefix("# ")) in printed, (line, printed)
        view = here("http://127.0.0.1:8100")
        assert "Dead letters" in httpx.get(f"{view}/", timeout=10).text
        # Given a dead letter (an increment of text), a delivery turned away, and records
        _keylane(env, tmp_path, "records", "set", "contact:42", "visits=many")
        _keylane(env, tmp_path, "records", "set", "contact:7", "visits=1")
        webhooks = f"http://127.0.0.1:{port}/webhooks/demo"
        bad: dict[str, Any] = {"id": "evt_9", "type": "t", "record_key": "contact:42"}
        bad["changes"] = {"visits": {"increment": 1}}
        answer = httpx.post(webhooks, json=bad, headers={"prefer": "wait=30"}, timeout=60)
        assert answer.json()["status"] == "dead_lettered", answer.text
        assert httpx.post(webhooks, json={"id": "x"}, timeout=10).status_code == 400
        # When each URL of the page is opened
        pages = {}
        for url in urls:
            got = httpx.get(here(url), timeout=10)
            assert got.status_code == 200, (url, got.text)
            pages[urlsplit(url).path + "?" + urlsplit(url).query] = got.text

        def listed(start: str) -> str:
            return next(html for key, html in pages.items() if key.startswith(start))

        # Then each shows what the page says it does
        typed = listed("/dead-letters?reason=type")
        assert _ids(typed, r'href="/dead-letters/(\d+)"') == ["1"]
        about = listed("/dead-letters?status=any&key=contact:42")
        assert _ids(about, r'href="/dead-letters/(\d+)"') == ["1"]
        kept = listed("/deliveries?source=demo")
        assert _ids(kept, r'href="/delivery\?id=(demo[^"]+)"')
        assert "400 invalid" in kept
        records = listed("/records?prefix=contact:")
        assert _ids(records, r'href="/record\?key=([^"]+)"') == ["contact%3A7"]
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(90) == 0, log.read_text()


def _keylane(env: dict[str, str], cwd: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keylane.ops.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
