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
import hashlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from ..router import EVENT_TASK, UNHOLD_TASK
from .errors import MalformedMessage
from .events import Event

_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"

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
    summary = f"{event.source}/{event.event_id} -> {event.record_key}"
    extra: dict[str, str | int] = {RECORD_HEADER: event.record_key}
    if batch > 1:
        extra[BATCH_HEADER] = batch_tag(event, batch)
    if event.retry_of is not None:
        extra[RETRY_OF_HEADER] = event.retry_of
    return build_task_message(
        EVENT_TASK, {"event": event.model_dump(mode="json")}, queue, summary, task_id, extra
    )


def batch_tag(event: Event, batch: int) -> str:
    """The :data:`BATCH_HEADER` value of ``event``'s message."""
    what = f"{event.source}\0{event.record_key}\0{event.destination or ''}"
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
) -> bytes:
    """A Celery protocol-2 message for ``task(**kwargs)`` in kombu's Redis layout."""
    task_id = task_id or str(uuid.uuid4())
    body = json.dumps(
        [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    )
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": repr({"summary": summary}),
        "origin": _ORIGIN,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        **(extra_headers or {}),
    }
    envelope = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(envelope).encode()


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
