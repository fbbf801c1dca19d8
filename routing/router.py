"""The Celery router: ``keylane.event`` messages go to their record's shard queue."""

from collections.abc import Mapping
from typing import Any

from .shards import ShardMap

#: The task of every event message: a lane handles it (applies it to keylane's records,
#: runs a task, forwards it, writes it where its record lives).
EVENT_TASK = "keylane.event"
#: What it was called before 0.2 (messages queued by an older receiver, and senders that
#: still use the name): handled the same way.
LEGACY_EVENT_TASK = "keylane.apply"
EVENT_TASKS = (EVENT_TASK, LEGACY_EVENT_TASK)
#: Control message: unhold a record key held behind a dead letter (run by the lanes).
UNHOLD_TASK = "keylane.unhold"


class ShardRouter:
    """A Celery router (``task_routes`` entry) that sends each event to its shard queue.

    keylane's receiver publishes directly, but anything that calls
    ``app.send_task("keylane.event", kwargs={"event": {...}})`` is routed the same way.
    """

    def __init__(self, shards: ShardMap) -> None:
        self.shards = shards

    def __call__(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        options: Mapping[str, Any],
        task: Any = None,
        **_: Any,
    ) -> dict[str, str] | None:
        if name not in EVENT_TASKS:
            return None
        event = kwargs.get("event")
        record_key = event.get("record_key") if isinstance(event, Mapping) else None
        if not isinstance(record_key, str):
            return None
        return {"queue": self.shards.queue_for_key(record_key)}
