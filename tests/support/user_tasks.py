"""User tasks, as a keylane user writes them (``keylane worker -A tests.support.user_tasks``).

``sync_contact`` is the classic race: search the CRM for the contact, then create the
page or append to it. Run straight from a thread pool it creates duplicates; run by
keylane, one event of a contact at a time, it cannot.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx

import keylane


def search_then_create(client: httpx.Client, api: str, payload: dict[str, Any]) -> str:
    """Find the contact's page by email; append the update to it, or create it."""
    found = client.post(f"{api}/v1/query", json={"email": payload["email"]}).json()["results"]
    if found:
        client.patch(f"{api}/v1/pages/{found[0]['id']}", json={"append": payload["seq"]})
        return "updated"
    client.post(f"{api}/v1/pages", json={"email": payload["email"], "updates": [payload["seq"]]})
    return "created"


_local = threading.local()


def _client() -> httpx.Client:
    """One HTTP client per lane thread."""
    if not hasattr(_local, "client"):
        _local.client = httpx.Client(timeout=10)
    return _local.client  # type: ignore[no-any-return]


@keylane.task(key="contact:{email}")
def sync_contact(event: keylane.Event, ctx: keylane.Context) -> keylane.Done:
    """Keep the CRM's page for this contact up to date (``TEST_CRM_URL``)."""
    try:
        what = search_then_create(_client(), os.environ["TEST_CRM_URL"], event.payload)
    except httpx.TransportError as exc:
        raise keylane.RetryLater(f"CRM unreachable: {exc}") from exc
    ctx.log.info("contact %s: page %s (attempt %s)", event.payload["email"], what, ctx.attempt)
    return keylane.Done(what)


@keylane.task(key="item:{item}")
def post_to_hook(event: keylane.Event, ctx: keylane.Context) -> keylane.Done:
    """Hand the event to a webhook (``TEST_HOOK_URL``) with its idempotency key."""
    headers = {"idempotency-key": ctx.idempotency_key, "keylane-record-key": event.record_key}
    try:
        answer = _client().post(os.environ["TEST_HOOK_URL"], json=event.payload, headers=headers)
    except httpx.TransportError as exc:
        raise keylane.RetryLater(f"hook unreachable: {exc}") from exc
    if answer.status_code >= 500:
        raise keylane.RetryLater(f"hook answered {answer.status_code}")
    if answer.status_code >= 400:
        raise keylane.GiveUp(f"hook refused: {answer.status_code} {answer.text}")
    return keylane.Done(f"HTTP {answer.status_code}")


def _post_batch(events: list[keylane.Event], ctx: keylane.Context) -> keylane.Done:
    """One call for a record's waiting events: their payloads in order, as one document."""
    doc = {"id": events[0].event_id, "items": [event.payload for event in events]}
    headers = {"idempotency-key": ctx.idempotency_key, "keylane-record-key": events[0].record_key}
    try:
        answer = _client().post(os.environ["TEST_HOOK_URL"], json=doc, headers=headers)
    except httpx.TransportError as exc:
        raise keylane.RetryLater(f"hook unreachable: {exc}") from exc
    if answer.status_code == 429:
        raise keylane.RetryLater("hook busy", delay_s=0.2)
    if answer.status_code >= 500:
        raise keylane.RetryLater(f"hook answered {answer.status_code}")
    if answer.status_code >= 400:
        raise keylane.GiveUp(f"hook refused: {answer.status_code} {answer.text}")
    return keylane.Done(f"{len(events)} items")


@keylane.task(key="list:{list}", batch=10)
def sync_list(events: list[keylane.Event], ctx: keylane.Context) -> keylane.Done:
    """A batch task: up to 10 of a list's waiting events in one call (``TEST_HOOK_URL``)."""
    return _post_batch(events, ctx)


@keylane.task(
    key="draft:{draft}", batch=100, debounce_ms=int(os.environ.get("TEST_DEBOUNCE_MS", "0") or 0)
)
def save_draft(events: list[keylane.Event], ctx: keylane.Context) -> keylane.Done:
    """A debounced batch task: a burst of edits to one draft is saved with one call."""
    return _post_batch(events, ctx)


@keylane.task(key="page:{page}", batch=20, debounce_ms=2000)
def sync_page(events: list[keylane.Event], ctx: keylane.Context) -> keylane.Done:
    """A debounced batch task as the README shows it: a page edited many times in a burst
    is written with one call (up to 20 edits; 2 s after its newest edit)."""
    return _post_batch(events, ctx)


@keylane.task(key="signup:{email}")
def flaky_signup(event: keylane.Event, ctx: keylane.Context) -> keylane.Done:
    """Refuses a plan it does not know; fails ``fail_first`` times before it syncs."""
    if event.payload.get("plan") == "unknown":
        raise keylane.GiveUp("the CRM does not know the plan 'unknown'")
    if ctx.attempt <= int(event.payload.get("fail_first", 0)):
        raise keylane.RetryLater("CRM busy", delay_s=0.05)
    ctx.log.info("synced (attempt %s)", ctx.attempt)
    return keylane.Done()
