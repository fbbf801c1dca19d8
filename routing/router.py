"""The Celery router: ``keylane.apply`` messages go to their record's shard queue."""

from collections.abc import Mapping
from typing import Any

from .shards import ShardMap

APPLY_TASK = "keylane.apply"
#: Control message: unhold a record key held behind a dead letter (run by the lanes).
UNHOLD_TASK = "keylane.unhold"


class ShardRouter:
    """A Celery router (``task_routes`` entry) that sends each event to its shard queue.

    keylane's receiver publishes directly, but anything that calls
    ``app.send_task("keylane.apply", kwargs={"event": {...}})`` is routed the same way.
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
        if name != APPLY_TASK:
            return None
        event = kwargs.get("event")
        record_key = event.get("record_key") if isinstance(event, Mapping) else None
        if not isinstance(record_key, str):
            return None
        return {"queue": self.shards.queue_for_key(record_key)}
