"""An HTTP records API with ETags, written for the tests: a stand-in for a CRM.

A record lives at ``/records/{key}`` as ``{"id": key, "fields": {...}, "last_edited": t}``.

* ``GET`` answers 200 with ``ETag: "v<version>"`` (one counter for every record, so a
  version never repeats), or 404.
* ``PUT`` with ``If-None-Match: *`` creates (412 if the record exists); with ``If-Match``
  replaces the fields (412 if the version moved, 404 if absent); without either, upserts.
* ``PATCH`` merges fields (``null`` removes one), with or without ``If-Match``; 404 if absent.
* :meth:`EtagServer.edit` is a person editing a record in the CRM's own UI: atomic on the
  server, as such an edit is.

Every request is logged in the order the server handled it (``ops``), writes with the
version they made. Knobs: ``etags = False`` (an API without versions: no ETag, conditions
ignored), ``delay_s`` (latency before each request is handled), ``drop`` (key -> "before"
or "after": the next write to it closes the connection without an answer, before or after
applying it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote


@dataclass
class Op:
    """One handled request or person edit."""

    seq: int
    key: str
    actor: str  # "keylane" (any HTTP client) or "person"
    kind: str  # get, create, put, patch, refused, edit
    version: int | None  # the version after it (None: nothing written)
    changed: dict[str, Any] = field(default_factory=dict)  # fields it wrote


@dataclass
class Stored:
    fields: dict[str, Any]
    version: int
    last_edited: str


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


class EtagServer:
    """The API, on a free port of 127.0.0.1, in a thread."""

    def __init__(self, etags: bool = True, delay_s: float = 0.0) -> None:
        self.etags = etags
        self.delay_s = delay_s
        self.drop: dict[str, str] = {}
        self.lock = threading.Lock()
        self.records: dict[str, Stored] = {}
        self.ops: list[Op] = []
        self._version = 0
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> EtagServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what a person does in the CRM ------------------------------------------------
    def edit(self, key: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> int | None:
        """Apply ``change`` (fields -> the fields it sets) to an existing record, atomically;
        return the new version (None if the record does not exist)."""
        with self.lock:
            stored = self.records.get(key)
            if stored is None:
                return None
            changed = change(dict(stored.fields))
            return self._write(key, "person", "edit", {**stored.fields, **changed}, changed)

    def fields(self, key: str) -> dict[str, Any]:
        """A record's fields as they are now."""
        with self.lock:
            return dict(self.records[key].fields)

    def ops_of(self, key: str) -> list[Op]:
        """The log of one record, in the order the server handled it."""
        with self.lock:
            return [op for op in self.ops if op.key == key]

    # -- internals ----------------------------------------------------------------------
    def _write(
        self, key: str, actor: str, kind: str, fields: dict[str, Any], changed: dict[str, Any]
    ) -> int:
        self._version += 1
        stamp = f"{time.time():.6f}-{self._version}"
        self.records[key] = Stored(fields, self._version, stamp)
        self.ops.append(Op(len(self.ops), key, actor, kind, self._version, changed))
        return self._version

    def _log(self, key: str, kind: str) -> None:
        self.ops.append(Op(len(self.ops), key, "keylane", kind, None))

    def _document(self, key: str) -> dict[str, Any]:
        stored = self.records[key]
        return {"id": key, "fields": stored.fields, "last_edited": stored.last_edited}

    def _etag(self, key: str) -> dict[str, str]:
        return {"ETag": f'"v{self.records[key].version}"'} if self.etags else {}

    def handle(
        self, method: str, key: str, headers: Any, body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        """One request, under the lock: (status, JSON answer, headers)."""
        with self.lock:
            stored = self.records.get(key)
            if method == "GET":
                self._log(key, "get")
                if stored is None:
                    return 404, {"error": "not found"}, {}
                return 200, self._document(key), self._etag(key)
            refusal = self._precondition(stored, headers, method)
            if refusal is not None:
                self._log(key, "refused")
                return refusal, {"error": "precondition failed"}, {}
            sent = (body or {}).get("fields", {})
            if method == "PATCH":
                merged = {**stored.fields, **sent} if stored else {}
                fields = {k: v for k, v in merged.items() if v is not None}
                kind = "patch"
            else:
                fields = {k: v for k, v in sent.items() if v is not None}
                kind = "create" if stored is None else "put"
            self._write(key, "keylane", kind, fields, sent)
            return (201 if kind == "create" else 200), self._document(key), self._etag(key)

    def _precondition(self, stored: Stored | None, headers: Any, method: str) -> int | None:
        if method == "PATCH" and stored is None:
            return 404
        if not self.etags:
            return None
        if headers.get("If-None-Match") == "*" and stored is not None:
            return 412
        if_match = headers.get("If-Match")
        if if_match is not None:
            if stored is None:
                return 404 if method == "PUT" else 412
            if if_match != f'"v{stored.version}"':
                return 412
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each answer waits for a delayed ACK
            wbufsize = 1 << 16  # headers and body leave in one write

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                if not self.path.startswith("/records/"):
                    self._answer(404, {"error": "no such path"}, {})
                    return
                key = unquote(self.path.removeprefix("/records/"))
                drop = owner.drop.pop(key, None) if self.command != "GET" else None
                if drop == "before":
                    self.close_connection = True
                    return
                status, answer, headers = owner.handle(self.command, key, self.headers, body)
                if drop == "after":
                    self.close_connection = True
                    return
                self._answer(status, answer, headers)

            def _answer(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_PATCH = _serve

        return Handler
