"""What a lane is handed: a record's :class:`Step` (its message, parsed and its record
read ahead when it came with the previous acknowledgement), the :class:`Queued` messages
of it that a lane applies together, and which of a record's waiting messages may go
with the first (:func:`followers`)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from ..routing.contract.errors import MalformedMessage
from ..routing.contract.events import Event
from ..routing.contract.identities import MERGE_SOURCE
from ..routing.contract.message import TaskMessage, parse_message
from ..routing.contract.wire import READS, version_of
from .broker import Taken
from .store import RecordStore
from .store_rows import Record


@dataclass(frozen=True)
class Step:
    """A record for a lane to handle. When it was taken as the lane finished the one
    before (one blocking call for the acknowledgement, the take and the read), also its
    message as parsed and its record as read right after: the first attempt's fresh read."""

    taken: Taken
    message: TaskMessage | None = None
    record: Record | None = None


@dataclass(frozen=True)
class Queued:
    """A message taken from a record's list, and the event it carries."""

    raw: bytes
    event: Event
    task_id: str


def followers(taken: Taken, first: Event, limit: int) -> list[Queued]:
    """The messages taken behind ``first`` that may be applied (or sent to a batch task)
    together with it, at most ``limit`` with it: its record's next events, while they
    parse, are of a wire version this worker reads, and are of the same source, record
    and destination. The others stay in the record's list, to be taken one by one."""
    out: list[Queued] = []
    for raw in taken.followers[: limit - 1]:
        try:
            message = parse_message(raw)
            if version_of(message.headers) not in READS:
                break  # taken alone, then parked
            event = Event.model_validate(message.kwargs.get("event"))
        except (MalformedMessage, ValidationError, TypeError, ValueError):
            break
        same = (event.source, event.record_key, event.destination) == (
            first.source,
            first.record_key,
            first.destination,
        )
        if not same or event.retry_of or event.review:
            break
        out.append(Queued(raw, event, message.task_id))
    return out


def read_taken(store: RecordStore, taken: Taken) -> Step:
    """(In a pool thread.) ``taken`` with its message parsed and its record read right
    after the take: the first attempt's fresh read, without a blocking call of its own."""
    try:
        message = parse_message(taken.raw)
        event = message.kwargs["event"]
        if event.get("destination"):  # its record is not in keylane's store
            return Step(taken, message)
        record = store.read(str(event["record_key"]))
    except Exception:
        # A head start only, never a reason to strand the record just handed out: the
        # lane parses and reads it again, and meets the error on its own path
        return Step(taken)
    return Step(taken, message, record)


def backlog_source(event: Event) -> str:
    """The source whose backlog an event leaves when it is done: its own, when an accept
    counted it in (a delivery, a send, a scheduled run); "" for a message no accept
    counted (a forward to a merge's survivor, an operator's retry, an id-reuse review, a
    merge's own step)."""
    if event.via is not None or event.retry_of is not None or event.review is not None:
        return ""
    return "" if event.source == MERGE_SOURCE else event.source
