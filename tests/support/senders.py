"""What the senders' tests share (tests/test_senders_*.py): one deployment per test file
(a real receiver and worker, the file's sources and secrets, the public URL senders sign),
and the checks every sender's test makes: a delivery applied to its record, nothing
recorded for a refused one.

The deployment is the module's, so each test uses records and ids of its own and waits
until what it sent is decided before it compares the state around a refused delivery.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import delete_namespace, fast_settings
from tests.support.stack import Stack, wait_until

#: The URL senders reach the receiver at (KEYLANE_PUBLIC_URL): what Twilio and HubSpot sign.
PUBLIC_URL = "https://hooks.example.com"


@contextlib.contextmanager
def sender_deployment(
    redis_url: str, tmp: Path, sources: str, secrets: Mapping[str, str]
) -> Iterator[Stack]:
    """A deployment of ``sources`` (TOML) with ``secrets`` in its environment, on its own
    namespace and SQLite store; stopped and its keys deleted afterwards."""
    namespace = f"kltest-{uuid.uuid4().hex[:10]}"
    settings = fast_settings(redis_url, namespace, f"sqlite:///{tmp / 'store.sqlite3'}", tmp / "d")
    path = tmp / "sources.toml"
    path.write_text(sources)
    stack = Stack(settings.model_copy(update={"sources_file": path, "public_url": PUBLIC_URL}), tmp)
    stack.extra_env.update(secrets)
    try:
        stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned()
        yield stack
    finally:
        stack.stop_all()
        delete_namespace(redis_url, namespace)


def send(
    stack: Stack,
    source: str,
    body: bytes,
    headers: Mapping[str, str],
    query: str = "",
    content_type: str | None = "application/json",
    receiver: str | None = None,
) -> httpx.Response:
    """POST ``body`` as a sender does: its own headers, ``content_type`` (None: no
    ``Content-Type`` header) and query string; to ``receiver`` (a URL) or the stack's."""
    url = f"{receiver or stack.url}/webhooks/{source}" + (f"?{query}" if query else "")
    sent = dict(headers) if content_type is None else {"content-type": content_type, **headers}
    return httpx.post(url, content=body, headers=sent, timeout=30)


def get(stack: Stack, source: str, query: str = "") -> httpx.Response:
    """A sender's ``GET`` of its webhook URL (Meta's and Mailchimp's checks)."""
    url = f"{stack.url}/webhooks/{source}" + (f"?{query}" if query else "")
    return httpx.get(url, timeout=30)


def settled(stack: Stack) -> tuple[int, dict[str, int]]:
    """Wait until every shard's messages are acknowledged (a lane counts an event's outcome
    when it acknowledges it), then the journal's size and the counters: what a refused
    delivery must leave as they are."""
    view = stack.view()

    def drained() -> bool:
        return all(shard["depth"] == 0 for shard in view.shard_states())

    wait_until(drained, 60, "every shard drained", on_timeout=stack.logs)
    return stack.open_store().journal_size(), stack.settled_counters()


def refused_changes_nothing(
    stack: Stack, attempts: Mapping[str, Callable[[], httpx.Response]], status: int = 401
) -> None:
    """Each of ``attempts`` (a forged delivery, by what is wrong with it) is answered
    ``status`` and records nothing: the journal and the counters stay as they were."""
    before = settled(stack)
    for case, attempt in attempts.items():
        answer = attempt()
        assert answer.status_code == status, (case, answer.text)
    assert settled(stack) == before


def applied(stack: Stack, key: str, fields: Mapping[str, Any]) -> None:
    """Once everything sent is decided, record ``key`` holds exactly ``fields`` (a lane may
    write several waiting events of a record at once, so its revision does not count
    events: its fields do, a counter or a list each event adds to)."""
    settled(stack)
    store = stack.open_store()
    store.migrate()
    record = store.read(key)
    assert record.fields == fields, (key, record)


def replayed(answer: httpx.Response) -> bool:
    """Whether ``answer`` is keylane's answer to a delivery it had already taken."""
    return answer.status_code == 200 and answer.headers.get("keylane-replayed") == "true"
