"""The store's role for the accepted deliveries it keeps (``deliveries``): what ``keylane
deliveries`` reads. The lanes write them with their events' journal rows
(:mod:`keylane.workers.stores.sql_writes`); the prune archives them with the journal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .store_rows import DeadLetter, JournalEntry


@dataclass(frozen=True)
class KeptDelivery:
    """An accepted delivery as kept: its id, source, when it came, its request
    (:func:`~keylane.routing.contract.kept_deliveries.kept_request`), and the journal rows
    of the events it became (those the table still holds)."""

    id: str
    source: str
    received_at: float
    request: dict[str, Any]
    events: list[JournalEntry] = field(default_factory=list)


@dataclass(frozen=True)
class KeptQuery:
    """Which kept deliveries to list: see :meth:`DeliveryStore.kept_deliveries`."""

    before_s: float
    limit: int
    sources: tuple[str, ...] = ()
    outcomes: tuple[str, ...] = ()
    since_s: float | None = None


class DeliveryStore(Protocol):
    """Reads of the kept deliveries."""

    def kept_delivery(self, delivery_id: str) -> KeptDelivery | None:
        """The kept delivery ``delivery_id`` with its events' journal rows, if kept."""
        ...

    def kept_deliveries(self, query: KeptQuery) -> list[KeptDelivery]:
        """Kept deliveries newest first, received at or before ``before_s`` and at or
        after ``since_s``, of ``sources`` (all when empty), one of whose events had an
        outcome of ``outcomes`` (journal outcomes; any when empty), at most ``limit``."""
        ...

    def dead_letters_of(self, source: str, event_ids: list[str]) -> list[DeadLetter]:
        """The review rows of these events of ``source``."""
        ...
