"""Alerts: every new dead letter is a Sentry event (when Sentry is configured) and a
counter (``dead_lettered`` in ``keylane status`` and the metrics)."""

from __future__ import annotations

import logging

import sentry_sdk

from ..routing.contract.events import Event
from .apply import ApplyResult

log = logging.getLogger("keylane.alerts")


def alert_dead_letter(event: Event, result: ApplyResult) -> None:
    """Log and report a new dead letter. Only ids and the reason leave the process: never
    the event's body or its values."""
    log.warning(
        "dead letter %s: %s/%s on %s (shard %s): %s",
        result.dead_letter_id,
        event.source,
        event.event_id,
        event.record_key,
        event.shard,
        result.reason,
    )
    if not sentry_sdk.is_initialized():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("keylane.source", event.source)
        scope.set_tag("keylane.event_id", event.event_id)
        scope.set_tag("keylane.record_key", event.record_key)
        scope.set_tag("keylane.shard", str(event.shard))
        scope.set_tag("keylane.reason", result.reason or "")
        scope.fingerprint = ["keylane-dead-letter", event.source, result.reason or ""]
        sentry_sdk.capture_message(
            f"dead letter {result.dead_letter_id}: {result.reason} ({event.source})",
            level="warning",
        )
