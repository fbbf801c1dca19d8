"""A small CRM to try the docs' examples against: contacts in memory, over HTTP, on the
standard library alone. The task on the Destinations page searches and creates contacts
here; the scheduled sync on the Schedules page pulls the ones that changed.

    python -m keylane.ops.examples.crm               # http://127.0.0.1:8100/api
    python -m keylane.ops.examples.crm --port 0      # a free port, named on its first line

    GET   /api/contacts[?updated_since=ISO]   {"results": [...]}: changed since (all without it)
    POST  /api/contacts/search {"email": E}   {"results": [...]}: the contacts whose fields
                                              have these values (any fields, in id order)
    POST  /api/contacts {...}                 201 and the new contact; a repeated
                                              Idempotency-Key answers the first one again
    PATCH /api/contacts/ID {...}              the contact, updated
    POST  /api/contacts/merge {"primary": P, "merged": M}
                                              contact P takes the fields of M it lacks, and
                                              M is gone (as a CRM's merge); a repeated
                                              Idempotency-Key answers the first one again

Every contact carries its ``version``: 1 when created, one more with every write.
    GET   /api/contacts/ID                    one contact

It starts with three contacts, so that a sync has something to pull. Like many CRMs it has
no unique constraint on email: two searches that run at once both find nothing, and both
create (the race keylane's lanes take away).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SEED = [
    {"email": "ada@Analytical.example", "name": "Ada", "company": "Analytical"},
    {"email": "grace@navy.example", "name": "Grace", "company": "Navy"},
    {"email": "edsger", "name": "Edsger", "company": "THE"},  # not an address
]


class Contacts:
    """The CRM's data: contacts by id, each stamped when it last changed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, dict[str, Any]] = {}
        self.by_idempotency_key: dict[str, int] = {}
        for fields in SEED:
            self.create(fields, None)

    def create(self, fields: dict[str, Any], key: str | None) -> dict[str, Any]:
        """A new contact (or, for a key seen before, the contact it created)."""
        with self.lock:
            if key is not None and key in self.by_idempotency_key:
                return self.by_id[self.by_idempotency_key[key]]
            contact_id = len(self.by_id) + 1
            stamp = {"id": contact_id, "version": 1, "updated_at": now()}
            self.by_id[contact_id] = {**fields, **stamp}
            if key is not None:
                self.by_idempotency_key[key] = contact_id
            return self.by_id[contact_id]

    def update(self, contact_id: int, fields: dict[str, Any]) -> dict[str, Any] | None:
        """The contact with ``fields`` written over it, or None when there is none."""
        with self.lock:
            if contact_id not in self.by_id:
                return None
            version = self.by_id[contact_id]["version"] + 1
            stamp = {"id": contact_id, "version": version, "updated_at": now()}
            self.by_id[contact_id].update({**fields, **stamp})
            return self.by_id[contact_id]

    def merge(self, primary: int, merged: int, key: str | None) -> dict[str, Any] | None:
        """Contact ``primary`` with the fields of ``merged`` it lacks; ``merged`` is gone
        (None when either is not there; for a key seen before, the first answer)."""
        with self.lock:
            if key is not None and key in self.by_idempotency_key:
                return self.by_id.get(self.by_idempotency_key[key])
            if primary == merged or primary not in self.by_id or merged not in self.by_id:
                return None
            gone = self.by_id.pop(merged)
            kept = self.by_id[primary]
            taken = {k: v for k, v in gone.items() if k not in kept}
            version = kept["version"] + 1
            kept.update({**taken, "version": version, "updated_at": now()})
            if key is not None:
                self.by_idempotency_key[key] = primary
            return kept

    def matching(
        self, fields: dict[str, Any] | None = None, since: str | None = None
    ) -> list[dict[str, Any]]:
        """The contacts with these values of ``fields``, or changed at or after ``since``."""
        with self.lock:
            found = [self.by_id[n] for n in sorted(self.by_id)]
        if fields:
            found = [c for c in found if all(c.get(k) == v for k, v in fields.items())]
        if since:
            found = [c for c in found if c["updated_at"] >= _utc(since)]
        return found


def now() -> str:
    """The time now, as the CRM stamps a change: ISO 8601 in UTC."""
    return datetime.now(UTC).isoformat()


def _utc(stamp: str) -> str:
    """``stamp`` (any ISO 8601 offset) in the form the contacts are stamped in."""
    return datetime.fromisoformat(stamp).astimezone(UTC).isoformat()


class CrmHandler(BaseHTTPRequestHandler):
    """The HTTP face of :class:`Contacts` (``server.contacts``)."""

    server: CrmServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/api/contacts":
            since = parse_qs(url.query).get("updated_since", [None])[0]
            self.answer(200, {"results": self.server.contacts.matching(since=since)})
        else:
            found = self.server.contacts.matching()
            contact = next((c for c in found if self.path == f"/api/contacts/{c['id']}"), None)
            self.found(contact)

    def do_POST(self) -> None:
        body = self.body()
        key = self.headers.get("Idempotency-Key")
        if self.path == "/api/contacts/search":
            self.answer(200, {"results": self.server.contacts.matching(body)})
        elif self.path == "/api/contacts":
            self.answer(201, self.server.contacts.create(body, key))
        elif self.path == "/api/contacts/merge":
            primary, merged = body.get("primary"), body.get("merged")
            if not (isinstance(primary, int) and isinstance(merged, int)):
                self.answer(400, {"error": "primary and merged are contact ids"})
                return
            self.found(self.server.contacts.merge(primary, merged, key))
        else:
            self.answer(404, {"error": "not found"})

    def do_PATCH(self) -> None:
        number = self.path.removeprefix("/api/contacts/")
        contact = (
            self.server.contacts.update(int(number), self.body()) if number.isdigit() else None
        )
        self.found(contact)

    def found(self, contact: dict[str, Any] | None) -> None:
        if contact is None:
            self.answer(404, {"error": "not found"})
        else:
            self.answer(200, contact)

    def body(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        parsed = json.loads(self.rfile.read(length) or b"{}")
        return parsed if isinstance(parsed, dict) else {}

    def answer(self, status: int, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the example's output is keylane's


class CrmServer(ThreadingHTTPServer):
    """The example CRM on ``host:port`` (port 0: a free one)."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 8100) -> None:
        super().__init__((host, port), CrmHandler)
        self.contacts = Contacts()

    @property
    def url(self) -> str:
        """The API's base URL, as the examples' ``CRM_URL``."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/api"


def main() -> None:
    """Serve the example CRM until interrupted."""
    parser = argparse.ArgumentParser(description="keylane's example CRM (contacts in memory)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100, help="0: a free port")
    options = parser.parse_args()
    with CrmServer(options.host, options.port) as server:
        print(f"example CRM on {server.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends it quietly
            server.serve_forever()


if __name__ == "__main__":
    main()
