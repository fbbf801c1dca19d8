"""A captured HTTP request read from a file (``keylane sources try``): its request line,
its headers, a blank line, its body, as a proxy, ``curl --trace-ascii`` or a provider's
delivery log shows it. Lines may end in CRLF or LF; a ``Content-Length`` cuts the body (an
editor's final newline is not part of it); a chunked body is put back together."""

from __future__ import annotations

from dataclasses import dataclass

from ..routing.contract.errors import ConfigError


@dataclass(frozen=True)
class CapturedRequest:
    """One request: method, path, query (as sent), headers (lowercased names, the first
    of a repeated one), body."""

    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes


def read_captured(raw: bytes) -> CapturedRequest:
    """The request in ``raw``; ``ConfigError`` naming what cannot be read."""
    head, body = _split(raw)
    lines = head.decode("latin-1").splitlines()
    if not lines or len(lines[0].split()) < 2:
        raise ConfigError("captured request: the first line is not METHOD PATH HTTP/1.1")
    method, target = lines[0].split()[:2]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ConfigError(f"captured request: not a header line: {line[:60]!r}")
        headers.setdefault(name.strip().lower(), value.strip())
    path, _, query = target.partition("?")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _unchunk(body)
    elif headers.get("content-length", "").isdigit():
        length = int(headers["content-length"])
        if length > len(body):
            raise ConfigError(
                f"captured request: Content-Length {length}, but the body has {len(body)} bytes"
            )
        body = body[:length]
    return CapturedRequest(method.upper(), path, query.encode("latin-1"), headers, body)


def _split(raw: bytes) -> tuple[bytes, bytes]:
    """The head and the body, at the first blank line, whichever line end it has: a head
    written with LF (an editor's) may be followed by a body whose own lines end in CRLF
    (a multipart body), whose blank lines are not the head's end."""
    ends = [(raw.find(blank), blank) for blank in (b"\r\n\r\n", b"\n\n")]
    found = [(at, blank) for at, blank in ends if at >= 0]
    if not found:
        return raw, b""
    at, blank = min(found)
    return raw[:at], raw[at + len(blank) :]


def _unchunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size:].lstrip(b"\r\n")
    return out
