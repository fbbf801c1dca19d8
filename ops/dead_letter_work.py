"""What ``keylane dlq`` and the web view read and do with review rows: list them, show
one (its record as it is now and the field-by-field diff), and act on some (retry,
discard, resolve) through :class:`~keylane.ops.triage.Triage`. Printing and asking are
the callers' (``ops/cli_dlq.py``, ``ops/web/``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..routing.contract.errors import KeylaneError
from ..routing.contract.settings import Settings
from ..routing.contract.sources import load_sources
from ..workers.store_rows import MERGE_REVIEW, DeadLetter, DeadLetterFilter
from .cli_common import cli_store
from .triage import (
    FieldDiff,
    Handled,
    RecordNow,
    Triage,
    field_diffs,
    kind_of,
    open_triage_broker,
    record_now,
    stats_summary,
)

if TYPE_CHECKING:
    from ..workers.stores.sql import SqlStore

#: What an operation does to one row.
Act = Callable[[Triage, DeadLetter], Handled]


@dataclass(frozen=True)
class DeadLetterShown:
    """One review row as ``dlq show`` shows it: the row, its record as it is now where it
    lives (None for a delivery to a task or a forward), and the field-by-field diff."""

    row: DeadLetter
    record: RecordNow | None
    diffs: list[FieldDiff]


def list_dead_letters(settings: Settings, selection: DeadLetterFilter) -> list[DeadLetter]:
    """The review rows ``selection`` takes, oldest first."""
    store = cli_store(settings)
    try:
        return store.dead_letters(selection)
    finally:
        store.close()


def dead_letter_stats(settings: Settings) -> dict[str, Any]:
    """``dlq stats``: counts by status, open rows by reason and source, the oldest's age."""
    store = cli_store(settings)
    try:
        return stats_summary(store.dead_letter_stats(), time.time())
    finally:
        store.close()


def show_dead_letter(settings: Settings, row_id: int) -> DeadLetterShown:
    """The review row ``row_id`` with its record as it is now; KeylaneError when none."""
    store = cli_store(settings)
    try:
        row = store.dead_letter(row_id)
        if row is None:
            raise KeylaneError(f"no dead letter with id {row_id}")
        sources_file = None if settings.sources_file is None else str(settings.sources_file)
        record = (
            None
            if kind_of(row) == "delivery"
            else record_now(row, store, load_sources(settings), sources_file)
        )
    finally:
        store.close()
    diffs = [] if record is None or row.reason == MERGE_REVIEW else field_diffs(row, record.fields)
    return DeadLetterShown(row, record, diffs)


def rows_to_act_on(store: SqlStore, selection: DeadLetterFilter) -> list[DeadLetter]:
    """The rows ``selection`` takes; KeylaneError naming any of its ``ids`` not found."""
    rows = store.dead_letters(selection)
    missing = sorted(set(selection.ids) - {r.id for r in rows})
    if missing:
        raise KeylaneError(f"no dead letter with id {', '.join(map(str, missing))}")
    return rows


def act_on(
    settings: Settings,
    store: SqlStore,
    rows: list[DeadLetter],
    act: Act,
    each: Callable[[list[DeadLetter]], Iterable[DeadLetter]] = lambda rows: rows,
) -> list[Handled]:
    """Do ``act`` to each of ``rows`` (in the order ``each`` gives them: a progress bar's),
    their messages through ``settings``' broker; what it did to each."""
    broker = open_triage_broker(settings, store)
    try:
        triage = Triage(store, broker)
        return [act(triage, row) for row in each(rows)]
    finally:
        broker.close()


def act_on_one(settings: Settings, row_id: int, act: Act) -> Handled:
    """Do ``act`` to the review row ``row_id`` (KeylaneError when there is none)."""
    store = cli_store(settings)
    try:
        rows = rows_to_act_on(store, DeadLetterFilter(ids=(row_id,)))
        return act_on(settings, store, rows, act)[0]
    finally:
        store.close()


def retry(by: str, note: str | None = None) -> Act:
    """Retry a row (``dlq retry``)."""
    return lambda triage, row: triage.retry(row, by, note)


def discard(by: str, note: str | None = None) -> Act:
    """Discard a row (``dlq discard``)."""
    return lambda triage, row: triage.close(row, "discarded", by, note)


def resolve(by: str, note: str) -> Act:
    """Resolve a row as handled by hand (``dlq resolve``)."""
    return lambda triage, row: triage.close(row, "resolved", by, note)
