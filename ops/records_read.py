"""What ``keylane records list`` / ``records get`` and the web view read: a page of
records by a query (:class:`~keylane.workers.store_rows.RecordQuery`: a key prefix,
fields equal to values, keyset pages by key), and one record with its identities.
Printing is the callers' (``ops/cli_records.py``, ``ops/web/``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..routing.contract.settings import Settings
from ..workers.store_rows import Record, RecordPage, RecordQuery
from .cli_common import cli_store


@dataclass(frozen=True)
class RecordShown:
    """A record as read (revision 0: there is none) and the identities it is known by."""

    record: Record
    identities: list[str]


def list_records(settings: Settings, query: RecordQuery) -> RecordPage:
    """The page of records ``query`` asks for, in key order."""
    store = cli_store(settings)
    try:
        return store.list_records(query)
    finally:
        store.close()


def get_record(settings: Settings, key: str) -> RecordShown:
    """The record ``key`` (absent: revision 0) with its identities."""
    store = cli_store(settings)
    try:
        return RecordShown(store.read(key), list(store.identities_of(key)))
    finally:
        store.close()
