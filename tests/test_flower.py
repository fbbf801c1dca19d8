"""Flower shows what the lanes do, as it happens: real worker, receiver and Flower
processes, a real local HTTP destination, and Flower's own task API read back.

A record whose destination keeps answering 503 is in ``RETRY`` with the reason, its
record key in the row; an applied event is ``SUCCESS``; a dead letter is ``FAILURE`` with
its reason.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.flower import AUTH, answers, tasks, worker_counts
from tests.support.notion import HookServer
from tests.support.services import free_port
from tests.support.stack import Stack, event, wait_until

pytestmark = pytest.mark.slow
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

HOOK_SECRET = "whsec_" + base64.b64encode(b"keylane-flower-test").decode()


@SQLITE
def test_flower_shows_events_in_flight_retrying_and_dead_lettered(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a forward whose server answers 503 for order:stuck, the demo source, a worker,
    # a receiver and Flower (with basic auth, as in production)
    hook = HookServer()
    hook.secret = HOOK_SECRET
    hook.unavailable.add("order:stuck")
    hook.start()
    try:
        sources = tmp_path / "sources.toml"
        sources.write_text(
            '[sources.demo]\n\n[sources.shop]\ndestination = "hook"\n'
            'record_key = "order:{body:order}"\n\n'
            f'[destinations.hook]\nkind = "http"\nurl = "{hook.url}/hook"\n'
            'secret_env = "TEST_HOOK_SECRET"\ntimeout_s = 5\nmax_backoff_s = 2\n'
        )
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        stack.extra_env.update(
            TEST_HOOK_SECRET=HOOK_SECRET, KEYLANE_FLOWER_BASIC_AUTH=":".join(AUTH)
        )
        stack.worker()
        stack.receiver()
        stack.wait_all_owned()
        port = free_port()
        stack._spawn("flower", ["flower", "--port", str(port)])
        flower = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(flower), 60, "Flower to answer", on_timeout=stack.logs)
        # When an order is stuck behind its destination, another goes through, and an
        # event of the demo source cannot apply (an increment of a text field)
        for body in (
            {"id": "s-1", "order": "stuck", "seq": 1},
            {"id": "ok-1", "order": "fine", "seq": 1},
        ):
            assert stack.post(body, source="shop").status_code == 202
        assert stack.post(event("d-1", "contact:1", name={"set": "Ada"})).status_code == 202
        assert stack.post(event("d-2", "contact:1", name={"increment": 1})).status_code == 202
        # Then Flower's tasks show each: the stuck one retrying with why, its record key in
        # the row; the applied ones succeeded; the dead letter failed with its reason
        rows: dict[str, dict[str, Any]] = {}

        def shown() -> bool:
            rows.update(tasks(flower))
            states = {row["args"]: row["state"] for row in rows.values()}
            return (
                any("order:stuck" in a and s == "RETRY" for a, s in states.items())
                and any("order:fine" in a and s == "SUCCESS" for a, s in states.items())
                and any("'d-2'" in a and s == "FAILURE" for a, s in states.items())
            )

        wait_until(shown, 90, "Flower to show the three", on_timeout=lambda: f"{rows}")
        stuck = next(r for r in rows.values() if "order:stuck" in r["args"])
        assert stuck["name"] == "keylane.event"
        assert "retry" in stuck["exception"], stuck
        assert "HTTP 503" in stuck["exception"], stuck
        failed = next(r for r in rows.values() if "'d-2'" in r["args"])
        assert "type" in failed["exception"], failed
        fine = next(r for r in rows.values() if "order:fine" in r["args"])
        assert fine["result"] == "'applied'", fine

        # And the Workers page counts as the Flower page says: Failed is the dead letter,
        # Succeeded the events decided otherwise, Processed every take of an event, so it
        # is more than the two while the stuck order is taken again after each wait
        def counted() -> bool:
            counts = list(worker_counts(flower).values())
            return len(counts) == 1 and counts[0][0] >= counts[0][1] + counts[0][2] + 2

        wait_until(counted, 90, "a second take of the stuck order", lambda: worker_counts(flower))
        ((processed, failed, succeeded),) = worker_counts(flower).values()
        assert failed == 1
        assert succeeded == 2  # ok-1 applied, d-1 applied; s-1 still waits
        assert processed > failed + succeeded
        # And the task list shows the args column (record key, source, event id) right
        # after the task's name, so rows are told apart by record
        page = httpx.get(f"{flower}/tasks", auth=AUTH, timeout=10).text
        shown_columns = re.findall(r'<th data-column="([a-z_]+)"', page)
        assert shown_columns[:2] == ["name", "args"], shown_columns
    finally:
        hook.stop()


@SQLITE
def test_flower_beyond_loopback_starts_only_with_a_password(stack: Stack) -> None:
    # Given Flower asked to listen on every address, with no password set
    refused = stack.keylane("flower", "--address", "0.0.0.0", "--port", str(free_port()))
    # Then it refuses to start: exit code 2, one line naming the variable to set
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "KEYLANE_FLOWER_BASIC_AUTH=user:password" in refused.stderr
    # When the password comes from the environment, as the compose file passes it
    stack.extra_env["KEYLANE_FLOWER_BASIC_AUTH"] = ":".join(AUTH)
    port = free_port()
    stack._spawn("flower", ["flower", "--address", "0.0.0.0", "--port", str(port)])
    flower = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(flower), 60, "Flower to answer", on_timeout=stack.logs)
    # Then it starts, and answers its API only with the password
    assert httpx.get(f"{flower}/api/workers", timeout=10).status_code == 401
    assert httpx.get(f"{flower}/api/workers", auth=AUTH, timeout=10).status_code == 200
