"""Records at URLs, as JSON documents: the one module that imports httpx.

Answers become the discipline's errors (:mod:`keylane.workers.resource`):

* a read: 404 is an absent record; 429, a 5xx or no connection is
  :class:`ResourceUnavailable`; any other 4xx is :class:`ResourceRejected`;
* a write: 412 or 409 (and 404 for an update: the record went away) is
  :class:`WriteConflict`; 429 or a connection never made is :class:`ResourceUnavailable`
  (nothing was sent); a 5xx, a timeout or a reset after sending is
  :class:`WriteOutcomeUnknown`; any other 4xx is :class:`ResourceRejected`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ...routing.contract.errors import (
    ResourceRejected,
    ResourceUnavailable,
    WriteConflict,
    WriteOutcomeUnknown,
)
from ...routing.contract.resources import HttpResourceConfig
from ..resource import Snapshot, Version

#: Errors raised before a request left this machine: it cannot have had an effect.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
#: How much of an answer's body an error message quotes.
QUOTED_CHARS = 300


@dataclass(frozen=True)
class Answer:
    """A 2xx answer: its JSON document (None when empty or not JSON) and its ETag."""

    status: int
    document: Any
    etag: str | None


class HttpRecords:
    """One HTTP client for one configured resource (holds a connection pool)."""

    def __init__(self, config: HttpResourceConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self._client = httpx.Client(
            headers=config.resolved_headers(environ), timeout=config.timeout_s
        )

    def url(self, key: str) -> str:
        """The record's URL; a key the template cannot take is refused."""
        try:
            return self.config.url_for(key)
        except ValueError as exc:
            raise ResourceRejected(str(exc)) from None

    def get(self, key: str) -> Answer | None:
        """The record's document, or None when it does not exist."""
        try:
            response = self._client.get(self.url(key))
        except httpx.TransportError as exc:
            raise ResourceUnavailable(f"GET {key}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            return None
        if response.status_code == 429 or response.status_code >= 500:
            raise _unavailable("GET", key, response)
        if response.status_code >= 400:
            raise ResourceRejected(_describe("GET", key, response), response.status_code)
        return _answer(response)

    def send(
        self, method: str, key: str, document: Any, headers: Mapping[str, str], creating: bool
    ) -> Answer:
        """A write; see the module docstring for what each failure becomes."""
        body = json.dumps(document).encode()
        sent = {"content-type": "application/json", **headers}
        try:
            response = self._client.request(method, self.url(key), content=body, headers=sent)
        except _NOT_SENT as exc:
            raise ResourceUnavailable(f"{method} {key}: {type(exc).__name__}: {exc}") from None
        except httpx.TransportError as exc:
            raise WriteOutcomeUnknown(f"{method} {key}: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status in (409, 412) or (status == 404 and not creating):
            raise WriteConflict(_describe(method, key, response))
        if status == 429:
            raise _unavailable(method, key, response)
        if status >= 500:
            raise WriteOutcomeUnknown(_describe(method, key, response))
        if status >= 400:
            raise ResourceRejected(_describe(method, key, response), status)
        return _answer(response)

    def read(self, key: str, version_of: Callable[[Answer, dict[str, Any]], Version]) -> Snapshot:
        """The record as a snapshot (absent on 404), its version taken from the answer and
        the fields by ``version_of``."""
        answer = self.get(key)
        if answer is None:
            return Snapshot({}, None)
        fields = self.fields_of(answer.document)
        return Snapshot(fields, version_of(answer, fields), answer.document)

    def fields_of(self, document: Any) -> dict[str, Any]:
        """The fields inside a record's document (at ``fields_at``)."""
        inner = document
        for part in self._path():
            inner = inner.get(part) if isinstance(inner, dict) else None
        if inner is None:
            return {}
        if not isinstance(inner, dict):
            raise ResourceRejected(
                f"the fields at {self.config.fields_at or 'the top'} are no object"
            )
        return dict(inner)

    def wrapped(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """A body carrying only ``fields``, at ``fields_at`` (what PATCH and create send)."""
        body: dict[str, Any] = dict(fields)
        for part in reversed(self._path()):
            body = {part: body}
        return body

    def merged(self, document: Any, fields: Mapping[str, Any]) -> Any:
        """``document`` as read with ``fields`` put in (``None`` removes one): a PUT body
        that leaves every other field as it was read."""
        out = copy.deepcopy(document) if isinstance(document, dict) else {}
        inner = out
        for part in self._path():
            inner = inner.setdefault(part, {})
        for name, value in fields.items():
            if value is None:
                inner.pop(name, None)
            else:
                inner[name] = value
        return out

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _path(self) -> list[str]:
        return self.config.fields_at.split(".") if self.config.fields_at else []


def _answer(response: httpx.Response) -> Answer:
    try:
        document = response.json() if response.content else None
    except ValueError:
        document = None
    return Answer(response.status_code, document, response.headers.get("etag"))


def _unavailable(method: str, key: str, response: httpx.Response) -> ResourceUnavailable:
    return ResourceUnavailable(
        _describe(method, key, response), retry_after_s(response.headers.get("retry-after"))
    )


def _describe(method: str, key: str, response: httpx.Response) -> str:
    excerpt = response.text[:QUOTED_CHARS]
    return f"{method} {key}: {response.status_code} {response.reason_phrase} {excerpt}".rstrip()


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (delta-seconds only; a date is ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
