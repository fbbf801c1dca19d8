"""Sentry, end to end: real keylane processes with the real sentry-sdk send their events to a
local HTTP server that keeps every envelope. A handler error and a dead letter arrive tagged
with the event they are about; ``keylane up`` reports a worker killed with SIGKILL; and no
envelope carries what a sender sent (bodies, headers, cookies) or a secret. Plus unit tests
of :func:`keylane.ops.observability.scrub`."""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import os
import re
import signal
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from keylane.ops.observability import FILTERED, _secrets, scrub
from keylane.routing.contract.settings import FaultSpec, Settings
from keylane.routing.contract.settings_env import load_settings
from tests.support.services import free_port
from tests.support.stack import Stack, event, settings_env, start_up, wait_until

SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

SENTRY_KEY = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
PROJECT = "4242"
ENVELOPE_PATH = f"/api/{PROJECT}/envelope/"

# Strings that must never leave a keylane process.
BODY_MARKER = "BODY-MARKER-7f3a"
HEADER_MARKER = "HEADER-MARKER-52c1"
COOKIE_MARKER = "COOKIE-MARKER-9d0e"
GH_SECRET = "GH-SECRET-4b8e-never-sent"
REDIS_PASSWORD = "REDIS-PW-61af"
FORBIDDEN = (BODY_MARKER, HEADER_MARKER, COOKIE_MARKER, GH_SECRET, REDIS_PASSWORD)
# What Sentry's request interface would carry from a delivery.
REQUEST_PARTS = {"data", "headers", "cookies", "query_string", "env"}

SOURCES = """
[sources.demo]

[sources.handled]
handler = "tests.support.handlers:fail_on_bad"

[sources.leaky]
handler = "tests.support.handlers:fail_with_secrets"

[sources.gh]
verify = { scheme = "github", secrets_env = ["TEST_GH_SECRET"] }
"""


# -- a Sentry that keeps what it is sent ------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """One POST the SDK made: its path, Content-Encoding and body as sent."""

    path: str
    encoding: str
    body: bytes

    @property
    def raw(self) -> bytes:
        """The body, decompressed."""
        return _decode(self.body, self.encoding)

    def items(self) -> list[tuple[dict[str, Any], bytes]]:
        """(item header, payload) pairs: a JSON envelope header line, then per item a
        JSON header line and a payload of ``length`` bytes (or up to the next newline)."""
        _, _, rest = self.raw.partition(b"\n")
        items = []
        while rest.strip():
            line, _, rest = rest.lstrip(b"\n").partition(b"\n")
            header = json.loads(line)
            length = header.get("length")
            if length is None:
                payload, _, rest = rest.partition(b"\n")
            else:
                payload, rest = rest[:length], rest[length:]
            items.append((header, payload))
        return items

    def events(self) -> list[dict[str, Any]]:
        """The error and message events in it."""
        return [json.loads(p) for h, p in self.items() if h.get("type") == "event"]


def _decode(body: bytes, encoding: str) -> bytes:
    # The SDK gzips envelopes, or uses brotli when the brotli module is installed.
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "br":
        import brotli  # type: ignore[import-not-found]

        return bytes(brotli.decompress(body))
    assert encoding in ("", "identity"), f"unexpected Content-Encoding {encoding!r}"
    return body


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EnvelopeHandler)
        self.envelopes: list[Envelope] = []
        self.lock = threading.Lock()


class _EnvelopeHandler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        with self.server.lock:
            self.server.envelopes.append(Envelope(self.path, encoding, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class SentryServer:
    """A local stand-in for sentry.io's ingest endpoint."""

    def __init__(self) -> None:
        self._http = _Recorder()
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def dsn(self) -> str:
        return f"http://{SENTRY_KEY}@127.0.0.1:{self._http.server_port}/{PROJECT}"

    @property
    def envelopes(self) -> list[Envelope]:
        with self._http.lock:
            return list(self._http.envelopes)

    def events(self) -> list[dict[str, Any]]:
        return [e for envelope in self.envelopes for e in envelope.events()]

    def wait_event(
        self,
        what: str,
        match: Callable[[dict[str, Any]], bool],
        logs: Callable[[], str] = str,
        timeout_s: float = 30,
    ) -> dict[str, Any]:
        """The first event that ``match``es, once it has arrived."""
        found: list[dict[str, Any]] = []

        def arrived() -> bool:
            found[:] = [e for e in self.events() if match(e)]
            return bool(found)

        wait_until(arrived, timeout_s, what, on_timeout=lambda: self._summary() + "\n" + logs())
        return found[0]

    def _summary(self) -> str:
        return "events so far:\n" + "\n".join(
            f"  {e.get('level')} {_title(e)!r} tags={e.get('tags')}" for e in self.events()
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


@pytest.fixture
def sentry() -> Iterator[SentryServer]:
    """A running local Sentry ingest endpoint."""
    server = SentryServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _title(event: dict[str, Any]) -> str:
    exceptions = (event.get("exception") or {}).get("values") or []
    if exceptions:
        return f"{exceptions[-1]['type']}: {exceptions[-1]['value']}"
    message = event.get("logentry") or {}
    return str(message.get("formatted") or message.get("message") or event.get("message", ""))


def _exception(event: dict[str, Any]) -> tuple[str, str] | None:
    exceptions = (event.get("exception") or {}).get("values") or []
    return (exceptions[-1]["type"], exceptions[-1]["value"]) if exceptions else None


def assert_nothing_leaked(sentry: SentryServer) -> None:
    """No envelope holds a marker a sender sent or a secret, and no event has the request's
    body, headers, cookies or query string."""
    assert sentry.envelopes, "Sentry received nothing"
    for envelope in sentry.envelopes:
        assert envelope.path == ENVELOPE_PATH
        for forbidden in FORBIDDEN:
            assert forbidden.encode() not in envelope.raw, (forbidden, envelope.raw.decode())
        for sent in envelope.events():
            assert not REQUEST_PARTS & set(sent.get("request") or {}), sent["request"]


# -- a deployment that reports to it ----------------------------------------------------------


def _with_password(redis_url: str) -> str:
    # The test Redis takes any password for its `nopass` default user.
    assert "@" not in redis_url, redis_url
    return redis_url.replace("redis://", f"redis://default:{REDIS_PASSWORD}@", 1)


def _start(stack: Stack, tmp_path: Path, sentry: SentryServer, **settings: Any) -> Stack:
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    stack.settings = stack.settings.model_copy(
        update={
            "sources_file": sources,
            "sentry_dsn": SecretStr(sentry.dsn),
            "redis_url": SecretStr(_with_password(stack.settings.redis_dsn())),
            "max_deliveries": 2,
            **settings,
        }
    )
    stack.extra_env["TEST_GH_SECRET"] = GH_SECRET
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    return stack


def _tags(event: dict[str, Any]) -> dict[str, str]:
    return dict(event.get("tags") or {})


def _event_tags(stack: Stack, source: str, event_id: str, record_key: str) -> dict[str, str]:
    return {
        "keylane.source": source,
        "keylane.event_id": event_id,
        "keylane.record_key": record_key,
        "keylane.shard": str(stack.settings.shards.shard_for_key(record_key)),
    }


def _post_github(stack: Stack, record_key: str, secret: str) -> int:
    """POST a delivery to the github-signed source (signed with ``secret``), with a marker in
    its body, in a header and in a cookie; the answer's status. One connection per delivery:
    uvicorn drops the connection after a 500."""
    body = json.dumps(event(f"g-{record_key}", record_key, note={"set": BODY_MARKER})).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "content-type": "application/json",
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": f"delivery-{record_key}",
        "X-Marker": HEADER_MARKER,
        "Cookie": f"session={COOKIE_MARKER}",
    }
    with httpx.Client(timeout=30) as client:
        return client.post(f"{stack.url}/webhooks/gh", content=body, headers=headers).status_code


@SQLITE_ONLY
def test_a_handler_error_is_an_error_event_tagged_with_its_event(
    stack: Stack, tmp_path: Path, sentry: SentryServer
) -> None:
    # Given a deployment reporting to Sentry, with a handler that raises on bad:* records
    _start(stack, tmp_path, sentry)
    # When an event for bad:1 arrives
    body = event("h-1", "bad:1", note={"set": BODY_MARKER})
    assert stack.post(body, source="handled").status_code == 202
    # Then Sentry gets the handler's exception, tagged with the event it is about
    sent = sentry.wait_event(
        "the handler error", lambda e: _exception(e) is not None, logs=stack.logs
    )
    assert _exception(sent) == ("RuntimeError", "this handler cannot deal with bad:1")
    assert sent["level"] == "error"
    tags = _tags(sent)
    assert tags.items() >= _event_tags(stack, "handled", "h-1", "bad:1").items()
    assert tags["keylane.component"] == "worker"
    # And nothing the sender sent, and no secret, went with it
    assert_nothing_leaked(sentry)


@SQLITE_ONLY
def test_a_dead_letter_is_a_warning_with_its_reason(
    stack: Stack, tmp_path: Path, sentry: SentryServer
) -> None:
    # Given a deployment reporting to Sentry
    _start(stack, tmp_path, sentry)
    # When a text field is incremented (a type error: a dead letter)
    assert stack.post(event("t-1", "contact:1", name={"set": BODY_MARKER})).status_code == 202
    assert stack.post(event("t-2", "contact:1", name={"increment": 1})).status_code == 202
    # Then Sentry gets a warning that names the dead letter, with the event's tags and reason
    sent = sentry.wait_event(
        "the dead letter alert",
        lambda e: _title(e).startswith("dead letter "),
        logs=stack.logs,
    )
    assert re.fullmatch(r"dead letter \d+: type \(demo\)", _title(sent)), _title(sent)
    assert sent["level"] == "warning"
    tags = _tags(sent)
    assert tags.items() >= _event_tags(stack, "demo", "t-2", "contact:1").items()
    assert tags["keylane.reason"] == "type"
    assert_nothing_leaked(sentry)


@SQLITE_ONLY
def test_nothing_a_sender_sent_and_no_secret_reaches_sentry(
    stack: Stack, tmp_path: Path, sentry: SentryServer
) -> None:
    # Given a deployment with a signed source, a Redis URL with a password, and a receiver
    # that fails (500) on boom:* records after it has read and verified the delivery
    _start(
        stack,
        tmp_path,
        sentry,
        faults=[FaultSpec(point="receiver.before_enqueue", action="raise", match="boom:")],
    )
    # When signed deliveries arrive, a valid one and one signed with another secret,
    # each with a marker in its body, its headers and a cookie
    assert _post_github(stack, "repo:1", GH_SECRET) == 202
    assert _post_github(stack, "repo:2", "not-the-secret") == 401
    # And a signed delivery makes the receiver fail
    assert _post_github(stack, "boom:1", GH_SECRET) == 500
    # And the worker fails on one event (until it is a dead letter), dead-letters another,
    # and runs a handler whose error message quotes the Redis password and the signing secret
    bad = event("h-1", "bad:1", note={"set": BODY_MARKER})
    assert stack.post(bad, source="handled").status_code == 202
    leak = event("l-1", "leak:1", note={"set": BODY_MARKER})
    assert stack.post(leak, source="leaky").status_code == 202
    assert stack.post(event("t-1", "contact:1", name={"set": BODY_MARKER})).status_code == 202
    assert stack.post(event("t-2", "contact:1", name={"increment": 1})).status_code == 202
    receiver_error = sentry.wait_event(
        "the receiver's error",
        lambda e: _exception(e) == ("InjectedFault", "fault injected at receiver.before_enqueue"),
        logs=stack.logs,
    )
    reasons = {"type", "handler_error"}
    sentry.wait_event(
        "the type and handler_error dead letters",
        lambda _: reasons <= {_tags(e).get("keylane.reason") for e in sentry.events()},
        logs=stack.logs,
    )
    leaky = sentry.wait_event(
        "the leaky handler's error",
        lambda e: (_exception(e) or ("",))[0] == "ConnectionError",
        logs=stack.logs,
    )
    # Then the secrets in the handler's error are replaced
    assert _exception(leaky) == (
        "ConnectionError",
        f"login failed with password {FILTERED}; webhook secret {FILTERED}",
    )
    # And the receiver's error says which request failed, but carries none of it
    assert receiver_error["request"]["url"].endswith("/webhooks/gh")
    assert _tags(receiver_error)["keylane.component"] == "receiver"
    # And no envelope from any process holds a body, a header, a cookie or a secret
    assert {_tags(e)["keylane.component"] for e in sentry.events()} == {"receiver", "worker"}
    # And logged errors were not sent as events of their own (only breadcrumbs)
    assert not [e for e in sentry.events() if e.get("logger")], sentry.events()
    assert_nothing_leaked(sentry)


# -- keylane up -------------------------------------------------------------------------------


@SQLITE_ONLY
def test_up_reports_a_worker_killed_with_sigkill(
    settings: Settings, tmp_path: Path, sentry: SentryServer
) -> None:
    # Given `keylane up` (one worker, no Flower) reporting to Sentry
    settings = settings.model_copy(
        update={"redis_url": SecretStr(_with_password(settings.redis_dsn()))}
    )
    env = settings_env(settings, data_dir=str(tmp_path / "up-data"))
    env["SENTRY_DSN"] = sentry.dsn
    log_path = tmp_path / "up.log"
    up = start_up(
        ["up", "--workers", "1", "--no-flower", "--port", str(free_port())], env, log_path
    )
    try:
        started = re.search(r"started worker-0 \(pid (\d+)\)", log_path.read_text())
        assert started, log_path.read_text()
        # When its worker is killed with SIGKILL
        os.kill(int(started[1]), signal.SIGKILL)
        # Then the supervisor tells Sentry, naming the child and the signal
        sent = sentry.wait_event(
            "the supervisor's report",
            lambda e: "died" in _title(e),
            logs=log_path.read_text,
        )
        assert _title(sent) == "keylane worker-0 died (signal SIGKILL); restarting"
        assert sent["level"] == "error"
        assert _tags(sent)["keylane.child"] == "worker-0"
        assert _tags(sent)["keylane.component"] == "supervisor"
        # And restarts it
        wait_until(
            lambda: len(re.findall(r"started worker-0", log_path.read_text())) == 2,
            30,
            "the worker to be restarted",
            on_timeout=log_path.read_text,
        )
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
    assert code == 0, log_path.read_text()
    assert_nothing_leaked(sentry)


# -- scrub ------------------------------------------------------------------------------------

SECRET = "s3cr3t-value"


def test_scrub_drops_what_the_request_carried_and_keeps_the_rest() -> None:
    # Given an event with the request interface Sentry's web integrations fill in
    sent = {
        "request": {
            "url": "http://127.0.0.1:8000/webhooks/gh",
            "method": "POST",
            "data": {"note": BODY_MARKER},
            "headers": {"X-Hub-Signature-256": "sha256=abc", "Cookie": "a=b"},
            "cookies": {"session": COOKIE_MARKER},
            "query_string": "token=abc",
            "env": {"REMOTE_ADDR": "10.0.0.1"},
        },
        "tags": {"keylane.source": "gh"},
    }
    # When it is scrubbed
    scrubbed = scrub(sent, [SECRET])
    # Then only the url and method of the request remain, and the rest of the event is intact
    assert scrubbed["request"] == {"url": "http://127.0.0.1:8000/webhooks/gh", "method": "POST"}
    assert scrubbed["tags"] == {"keylane.source": "gh"}


def test_scrub_replaces_secrets_anywhere() -> None:
    # Given secrets in messages, exception values, nested lists and dicts, and extra data
    sent = {
        "logentry": {"message": f"connect redis://:{SECRET}@host failed", "params": [SECRET]},
        "exception": {
            "values": [{"type": "ValueError", "value": f"bad key {SECRET}!", "stacktrace": {}}]
        },
        "extra": {"nested": [{"deep": [f"x{SECRET}y", 7, None]}], "n": 1.5},
        "contexts": {"other": {"url": f"postgresql://u:{SECRET}@db/x"}},
    }
    # When it is scrubbed
    scrubbed = scrub(sent, [SECRET, "unused-secret"])
    # Then no secret remains, each is replaced in place, and non-strings are untouched
    assert SECRET not in json.dumps(scrubbed)
    assert scrubbed["logentry"] == {
        "message": f"connect redis://:{FILTERED}@host failed",
        "params": [FILTERED],
    }
    assert scrubbed["exception"]["values"][0]["value"] == f"bad key {FILTERED}!"
    assert scrubbed["extra"] == {"nested": [{"deep": [f"x{FILTERED}y", 7, None]}], "n": 1.5}
    assert scrubbed["contexts"]["other"]["url"] == f"postgresql://u:{FILTERED}@db/x"


def test_scrub_cleans_breadcrumbs() -> None:
    # Given a breadcrumb (as before_breadcrumb gets it) and an event carrying breadcrumbs
    crumb = {"category": "keylane.receiver", "message": f"secret is {SECRET}", "data": {}}
    sent = {"breadcrumbs": {"values": [{"message": SECRET, "data": {"k": [SECRET]}}]}}
    # When each is scrubbed
    scrubbed_crumb = scrub(crumb, [SECRET])
    scrubbed_event = scrub(sent, [SECRET])
    # Then no secret remains in either
    assert scrubbed_crumb == {**crumb, "message": f"secret is {FILTERED}"}
    assert scrubbed_event == {
        "breadcrumbs": {"values": [{"message": FILTERED, "data": {"k": [FILTERED]}}]}
    }


def test_scrub_without_secrets_leaves_values_alone() -> None:
    sent = {"message": "plain", "extra": {"list": ["a", 1]}, "request": {"url": "u"}}
    assert scrub(sent, []) == sent


def test_the_secrets_to_scrub_include_signing_secrets_and_url_passwords(
    tmp_path: Path,
) -> None:
    # Given a signed source, and URLs with credentials (one percent-encoded)
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    redis_url = "redis://default:pa%40ss-word@127.0.0.1:6379/0"
    settings = load_settings(
        sources_file=sources,
        redis_url=redis_url,
        store_url="postgresql://keylane:pg-password@db:5432/keylane",
    )
    # When the secrets to scrub are collected
    secrets = _secrets(settings, {"TEST_GH_SECRET": GH_SECRET})
    # Then the signing secret and each password (as written and decoded) are there,
    # each whole URL before the password in it
    assert {GH_SECRET, "pa%40ss-word", "pa@ss-word", "pg-password"} <= set(secrets)
    assert secrets.index(redis_url) < secrets.index("pa%40ss-word")
    assert scrub({"message": f"{redis_url} and pa@ss-word"}, secrets) == {
        "message": f"{FILTERED} and {FILTERED}"
    }
