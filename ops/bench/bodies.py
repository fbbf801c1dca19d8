"""The bodies the receiver benchmark posts, one kind per round (``--body``): the same event
(a new id, one of 1,024 record keys) written as JSON, a form, ``multipart/form-data``
(two text fields) or XML, each read by one mapped source, ``bench``, whose references
find the same tree in every format (``{"event": {"id": ..., "key": ...}}``: XML's root
element, form and multipart fields named with brackets); or keylane's own envelope,
taken by the ``demo`` source (what part (a) posted before it had kinds).

Each kind is a piece of Lua for wrk's script (:mod:`keylane.ops.bench.wrk`): its
``Content-Type`` and a ``body(id, key)`` function.
"""

from __future__ import annotations

from pathlib import Path

#: The bench's sources file: ``demo`` (the envelope) and ``bench`` (every other kind).
SOURCES = """\
# Written by the receiver benchmark (keylane.ops.bench.bodies).
[sources.demo]

[sources.bench]
format = "mapped"
event_id = "body:event.id"
record_key = "bench:{body:event.key}"

[sources.bench.on."*"]
n = { increment = 1 }
last = { set = "body:event.id" }
"""

#: The multipart boundary (a browser's is of this shape).
BOUNDARY = "----klbench7MA4YWxkTrZu0gW"

# Lua per kind: the headers and body(id, key). Ids and keys are letters, digits, "-" and
# ".", which no format has to escape.
_LUA = {
    "json": r"""
local headers = {["Content-Type"] = "application/json"}
local function body(id, key)
  return string.format('{"event": {"id": "%s", "key": "%s"}}', id, key)
end
""",
    "form": r"""
local headers = {["Content-Type"] = "application/x-www-form-urlencoded"}
local function body(id, key)
  return string.format("event%%5Bid%%5D=%s&event%%5Bkey%%5D=%s", id, key)
end
""",
    "multipart": r"""
local boundary = "BOUNDARY"
local headers = {["Content-Type"] = "multipart/form-data; boundary=" .. boundary}
local function body(id, key)
  return string.format(
    '--%s\r\nContent-Disposition: form-data; name="event[id]"\r\n\r\n%s\r\n' ..
    '--%s\r\nContent-Disposition: form-data; name="event[key]"\r\n\r\n%s\r\n--%s--\r\n',
    boundary, id, boundary, key, boundary)
end
""".replace("BOUNDARY", BOUNDARY),
    "xml": r"""
local headers = {["Content-Type"] = "application/xml"}
local function body(id, key)
  return string.format(
    '<?xml version="1.0" encoding="UTF-8"?>\n<event><id>%s</id><key>%s</key></event>', id, key)
end
""",
    "envelope": r"""
local headers = {["Content-Type"] = "application/json"}
local function body(id, key)
  return string.format(
    '{"id": "%s", "type": "bench.increment", "record_key": "bench:%s", ' ..
    '"changes": {"n": {"increment": 1}}}', id, key)
end
""",
}

#: Every kind, in the order the report shows them.
KINDS = tuple(_LUA)


def lua_of(kind: str) -> str:
    """The Lua that makes ``kind``'s requests: ``headers`` and ``body(id, key)``."""
    return _LUA[kind]


def source_of(kind: str) -> str:
    """The source that reads ``kind``."""
    return "demo" if kind == "envelope" else "bench"


def write_sources(directory: Path) -> Path:
    """The bench's sources file, written in ``directory``."""
    path = directory / "bench-sources.toml"
    path.write_text(SOURCES)
    return path
