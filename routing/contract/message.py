"""Celery task messages for ``keylane.apply``, as they sit in a shard queue in Redis.

The receiver does not go through a kombu producer: it pushes the message and records the
dedupe mark in one Lua script (so an accepted event and its mark can never exist one
without the other), which needs the message as bytes. This module builds those bytes in
exactly the layout kombu's Redis transport uses for Celery's task protocol 2
(https://docs.celeryq.dev/en/stable/internals/protocol.html), so the queues remain
ordinary Celery queues: Flower, ``celery inspect`` and a plain Celery worker read them.
``tests/test_message.py`` checks the layout against a real kombu round trip.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import platform
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ..router import EVENT_TASK, UNHOLD_TASK
from .errors import MalformedMessage
from .events import Event
from .wire import WIRE_HEADER, WIRE_VERSION

_ORIGIN = f"{os.getpid()}@{platform.node()}"

#: Headers keylane's scripts read (the lane broker decodes a message's headers, never its
#: text): the record a message belongs to, which decides the list it waits in.
RECORD_HEADER = "keylane_record"
#: A lane may take several waiting events of one record at once when their messages carry
#: the same value: the source's (or task's) batch limit and a digest of (source, record
#: key, destination), ``"<limit>:<hex>"``.
BATCH_HEADER = "keylane_batch"
#: The control message that releases a record held behind this dead letter id.
UNHOLD_HEADER = "keylane_unhold"
#: An operator's retry of this dead letter: when that dead letter holds the record, the
#: retry goes first in the record's list and releases it.
RETRY_OF_HEADER = "keylane_retry_of"


@dataclass(frozen=True)
class TaskMessage:
    """A decoded task message."""

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    redelivered: bool


def build_event_message(
    event: Event, queue: str, task_id: str | None = None, batch: int = 1
) -> bytes:
    """The Redis list entry that asks a lane to handle ``event``; with ``batch`` > 1, a lane
    may take it together with up to ``batch`` - 1 events of the same record waiting behind
    it (see :data:`BATCH_HEADER`)."""
    return event_message(event.model_dump(mode="json"), queue, batch, task_id)


def event_message(
    event: Mapping[str, Any],
    queue: str,
    batch: int = 1,
    task_id: str | None = None,
    wire: int = WIRE_VERSION,
) -> bytes:
    """:func:`build_event_message` for an event in its wire form (what
    ``Event.model_dump(mode="json")`` gives, and what a lane reads back with
    ``Event.model_validate``): the receiver builds that form directly. ``wire``: the
    version written (:mod:`.wire`; the event already in that version's form)."""
    source, event_id, record_key = event["source"], event["event_id"], event["record_key"]
    summary = f"{source}/{event_id} -> {record_key}"
    extra: dict[str, str | int] = {RECORD_HEADER: record_key}
    if batch > 1:
        extra[BATCH_HEADER] = batch_tag(source, record_key, event.get("destination"), batch)
    if event.get("retry_of") is not None:
        extra[RETRY_OF_HEADER] = event["retry_of"]
    return build_task_message(EVENT_TASK, {"event": event}, queue, summary, task_id, extra, wire)


def batch_tag(source: str, record_key: str, destination: str | None, batch: int) -> str:
    """The :data:`BATCH_HEADER` value of an event of ``source`` about ``record_key`` for
    ``destination``: events with the same value may be taken together."""
    what = f"{source}\0{record_key}\0{destination or ''}"
    return f"{batch}:{hashlib.sha256(what.encode()).hexdigest()[:32]}"


def build_unhold_message(record_key: str, dead_letter_id: int, queue: str) -> bytes:
    """The control message that releases ``record_key`` if ``dead_letter_id`` holds it."""
    return build_task_message(
        UNHOLD_TASK,
        {"record_key": record_key, "dead_letter_id": dead_letter_id},
        queue,
        f"unhold {record_key} (dead letter {dead_letter_id})",
        extra_headers={RECORD_HEADER: record_key, UNHOLD_HEADER: dead_letter_id},
    )


def build_task_message(
    task: str,
    kwargs: dict[str, Any],
    queue: str,
    summary: str,
    task_id: str | None = None,
    extra_headers: dict[str, str | int] | None = None,
    wire: int = WIRE_VERSION,
) -> bytes:
    """A Celery protocol-2 message for ``task(**kwargs)`` in kombu's Redis layout, filled
    into the layout's template (:func:`_template`), of wire version ``wire`` (version 1,
    keylane 0.1.0's, names none)."""
    if wire >= 2:
        extra_headers = {**(extra_headers or {}), WIRE_HEADER: wire}
    task_id = task_id or new_task_id()
    body = _BODY_HEAD + _ENCODE(kwargs) + _BODY_TAIL
    values = {
        "body": b'"' + base64.b64encode(body) + b'"',
        "task": _ENCODE(task),
        "id": _ENCODE(task_id),
        "kwargsrepr": _ENCODE(repr({"summary": summary})),
        "queue": _ENCODE(queue),
        "tag": _ENCODE(new_task_id()),
    }
    names: tuple[str, ...] = ()
    if extra_headers:
        names = tuple(extra_headers)
        values.update((f"x{i}", _ENCODE(v)) for i, v in enumerate(extra_headers.values()))
    return b"".join(
        values[piece] if isinstance(piece, str) else piece for piece in _template(names)
    )


def new_task_id() -> str:
    """A random UUID (version 4) as text, for task ids and delivery tags.

    Drawn from :mod:`random` (seeded from the OS at start-up and again in every forked
    child) rather than :func:`uuid.uuid4`, which asks the kernel for 16 bytes per id: these
    ids must be unique, not secret, and two of them per accepted event made ``uuid4``
    a visible share of the receiver's time."""
    h = f"{random.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


_VARIANT = "89ab"
_ENCODE = msgspec.json.Encoder().encode
_BODY_HEAD = b"[[], "
_BODY_TAIL = b', {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'


@functools.lru_cache(maxsize=8)
def _template(extra_headers: tuple[str, ...]) -> tuple[bytes | str, ...]:
    """kombu's Redis layout of a Celery protocol-2 message as literal pieces (bytes) and
    slot names (text), written once by ``json.dumps``. (The lane broker decodes headers as
    JSON, so the layout's separators carry no meaning.)"""
    headers: dict[str, Any] = {
        "lang": "py",
        "task": _slot("task"),
        "id": _slot("id"),
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": _slot("id"),
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": _slot("kwargsrepr"),
        "origin": _ORIGIN,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        **{name: _slot(f"x{i}") for i, name in enumerate(extra_headers)},
    }
    envelope = {
        "body": _slot("body"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": _slot("id"),
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": _slot("queue")},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": _slot("tag"),
        },
    }
    parts = _SLOT.split(json.dumps(envelope))
    # re.split alternates literal text and the captured slot names.
    return tuple(part if n % 2 else part.encode() for n, part in enumerate(parts) if part)


_SLOT = re.compile(r'"\\u0000(\w+)\\u0000"')


def _slot(name: str) -> str:
    return f"\x00{name}\x00"


def parse_message(raw: bytes) -> TaskMessage:
    """Decode a shard-queue entry; :class:`MalformedMessage` says why it is not one."""
    try:
        envelope = json.loads(raw)
        headers = envelope["headers"]
        props = envelope["properties"]
        if envelope.get("content-type") != "application/json":
            raise MalformedMessage(f"unsupported content type {envelope.get('content-type')!r}")
        body_raw = envelope["body"]
        if props.get("body_encoding") == "base64":
            body_raw = base64.b64decode(body_raw)
        args, kwargs, _embed = json.loads(body_raw)
        return TaskMessage(
            task_id=str(headers["id"]),
            task_name=str(headers["task"]),
            args=list(args),
            kwargs=dict(kwargs),
            headers=dict(headers),
            redelivered=bool(
                headers.get("redelivered") or props.get("delivery_info", {}).get("redelivered")
            ),
        )
    except MalformedMessage:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedMessage(f"not a Celery task message: {exc}") from exc


def with_header(raw: bytes, name: str, value: str | int) -> bytes:
    """The message ``raw`` with one more header (Celery's envelope, whatever the wire
    version of the event inside): an operator's retry of a message kept whole."""
    envelope = json.loads(raw)
    envelope["headers"][name] = value
    return json.dumps(envelope).encode()


def event_of(raw: bytes | None) -> dict[str, Any] | None:
    """The event a shard message carries, in its wire form (None for no message, a
    message that is not keylane's, or a control message): what status and the queue watch
    read of a queue's head, without building the model."""
    if raw is None:
        return None
    try:
        event = parse_message(raw).kwargs.get("event")
    except MalformedMessage:
        return None
    return event if isinstance(event, dict) else None
