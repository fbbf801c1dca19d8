"""Reading a Flower process the tests started: its health check and its JSON API."""

from __future__ import annotations

import re
from typing import Any

import httpx

#: The basic auth the tests give Flower (``KEYLANE_FLOWER_BASIC_AUTH``): its API answers
#: only behind authentication.
AUTH = ("ops", "flower-test")


def answers(flower: str) -> bool:
    """Whether Flower at ``flower`` answers its health check."""
    try:
        return httpx.get(f"{flower}/healthcheck", timeout=5).text == "OK"
    except httpx.HTTPError:
        return False


def api(flower: str, path: str) -> dict[str, Any]:
    """A JSON object from Flower's API (empty while it cannot answer)."""
    try:
        answer = httpx.get(f"{flower}/api/{path}", auth=AUTH, timeout=10)
    except httpx.HTTPError:
        return {}
    if answer.status_code != 200:
        return {}
    body = answer.json()
    return body if isinstance(body, dict) else {}


def tasks(flower: str) -> dict[str, dict[str, Any]]:
    """The tasks Flower has seen, by id (``args`` always a string)."""
    return {
        uuid: {**row, "args": row.get("args") or ""} for uuid, row in api(flower, "tasks").items()
    }


def worker_counts(flower: str) -> dict[str, tuple[int, int, int]]:
    """The Workers page's counts, by worker: (Processed, Failed, Succeeded), as the page
    shows them (Flower counts its ``task-received``, ``task-failed`` and
    ``task-succeeded`` events)."""
    page = httpx.get(f"{flower}/workers", auth=AUTH, timeout=10).text
    counts = {}
    for name, cells in re.findall(r'<tr id="[^"]*">\s*<td>([^<]+)</td>(.*?)</tr>', page, re.S):
        numbers = [int(n.replace(",", "")) for n in re.findall(r"<td>([\d,]+)</td>", cells)]
        _active, processed, failed, succeeded = numbers[:4]
        counts[name] = (processed, failed, succeeded)
    return counts
