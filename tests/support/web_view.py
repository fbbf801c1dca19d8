"""A deployment for the web view's tests: deliveries turned away and kept, two dead letters and
records (one whose key and field are markup), and a client of its web view."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from keylane.ops.outside_edit import edit_record
from keylane.workers.store_rows import DeadLetterFilter
from tests.support.stack import Stack, event, wait_until

SOURCES = """
[sources.demo]

[sources.crm]
owns = ["email"]
"""
HOSTILE = "<script>alert(1)</script>"
HOSTILE_KEY = 'evil:"><img src=x onerror=alert(2)>'
TOKEN = re.compile(r'name="token" value="([^"]+)"')


@dataclass
class View:
    """A deployment with deliveries turned away, two dead letters and records, and its
    web view's address."""

    stack: Stack
    base: str
    http: httpx.Client

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.http.get(f"{self.base}{path}", params=params or None)

    def page(self, path: str, **params: Any) -> str:
        answer = self.get(path, **params)
        assert answer.status_code == 200, answer.text
        return answer.text

    def cli(self, *args: str) -> Any:
        done = self.stack.keylane(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def post(self, path: str, form: dict[str, str], **headers: str) -> httpx.Response:
        return self.http.post(f"{self.base}{path}", data=form, headers=headers)

    def token(self, row_id: int) -> str:
        found = TOKEN.search(self.page(f"/dead-letters/{row_id}"))
        assert found is not None
        return found.group(1)


@contextmanager
def viewed_deployment(stack: Stack) -> Iterator[View]:
    """Start ``stack``'s worker and receiver, fill it, and give its web view's client."""
    # Given a deployment (the test's store) whose two sources are demo and crm (owns email)
    stack.use_sources(SOURCES)
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    store = stack.open_store()
    store.migrate()
    # with a record whose field and key are markup, and one holding text where an
    # increment will come
    edit_record(store, HOSTILE_KEY, {"name": HOSTILE})
    edit_record(store, "contact:42", {"visits": "many"})
    edit_record(store, "contact:7", {"email": "a@b.c"})
    # and two dead letters: an increment of text (type), a field crm does not own
    assert stack.post(event("evt_8", "contact:42", visits={"increment": 1})).status_code == 202
    crm = event("crm_1", "contact:43", plan={"set": "pro"})
    assert stack.post(crm, source="crm").status_code == 202
    # and five deliveries turned away: four without a record key (one with a header that
    # is markup), one to crm
    for n in range(4):
        body = {"id": f"bad_{n}", "type": "t", "changes": {}}
        assert stack.post(body, **{"x-note": HOSTILE}).status_code == 400
    assert stack.post({"id": "bad_crm", "type": "t"}, source="crm").status_code == 400
    wait_until(
        lambda: len(store.dead_letters(DeadLetterFilter())) == 2,
        60,
        "two dead letters",
        on_timeout=stack.logs,
    )
    with httpx.Client(timeout=30) as http:
        shown = View(stack, stack.ops_url, http)
        # and the two dead-lettered events' deliveries kept (the default window: errors)
        wait_until(lambda: len(shown.cli("deliveries", "list")["deliveries"]) == 7, 30, "7 kept")
        yield shown
