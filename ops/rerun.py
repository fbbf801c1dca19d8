"""``keylane deliveries rerun``: kept deliveries run again through their source's
**current** mapping, alone or in bulk by filter: the way back after a mapping is fixed.

Each delivery goes through the receiver's own steps in this process
(:mod:`keylane.producers.rerun`): read and mapped as its source now says, its events
deduped on their ids and queued as any delivery's. What that means for exactly once:

* an event whose id was accepted before is a **duplicate**: not queued, not applied again
  (the lane would not apply it twice either: its journal has it), and said so, with its
  outcome when it is known;
* ``--new-ids`` gives each event a new id (``<id>:rerun-<ms>``, the same for every event of
  one run): each is then a new event and is applied, whatever became of the first;
* a delivery the mapping still refuses is told (its status and why), not kept again.

A delivery can be run again when its body was kept whole: not one refused unverified
(kept without its body), nor one refused before its body was read (``413``, ``415``), nor
one whose body was cut at the bound, nor one whose mapping reads a value that was redacted
when it was kept. ``--dry-run`` reads and maps each one, and says of each event whether
the journal has it (a duplicate) or it would be new; nothing is queued.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..producers.answers import REPLAYED, Answer
from ..producers.broker import open_event_queue
from ..producers.door import Seen, kept_for
from ..producers.intake import Ignored, Intake
from ..producers.receiver import Receiver
from ..producers.rerun import KeptCheck, body_of
from ..routing.contract.door import REDACTED
from ..routing.contract.errors import KeylaneError
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources, load_sources
from ..workers.store import JournalStore
from .archive import Archive
from .deliveries import DeliveryQuery, body_kept, list_deliveries, show_delivery
from .lookup import find_events

#: How a rerun makes each event's id new (``--new-ids``).
Rename = Callable[[str], str]

#: Headers of a kept request that a rerun does not send on: a rerun never waits for
#: its events' outcomes (``Prefer``), and its body's length is its own.
DROPPED_HEADERS = frozenset({"prefer", "content-length", "transfer-encoding"})


@dataclass
class RerunEvent:
    """One event a kept delivery became this time, and what became of it: ``new``
    (queued: it will be applied), ``duplicate`` (accepted before: not applied again),
    ``reused`` (its id came before with another body: recorded for review, not applied),
    ``ignored`` (the mapping maps nothing for it); in a dry run ``new`` or ``duplicate``
    as the journal says."""

    result: str
    event_type: str
    event_id: str | None = None
    record_key: str | None = None
    shard: int | None = None
    changes: dict[str, Any] | None = None
    #: The journal's outcome of the id's earlier event (``applied``, ``refused``, ...).
    before: str | None = None
    reason: str | None = None


@dataclass
class Rerun:
    """What became of one kept delivery: ``ran`` (its events were accepted, each as its
    result says), ``mapped`` (a dry run), ``refused`` (the mapping or the deployment
    refused it: ``status`` and ``reason``) or ``cannot`` (it cannot be run again:
    ``reason``)."""

    delivery: str
    source: str
    verdict: str
    status: int | None = None
    reason: str | None = None
    events: list[RerunEvent] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.verdict in ("refused", "cannot")


def chosen(
    settings: Settings, ids: tuple[str, ...], query: DeliveryQuery | None, most: int
) -> list[dict[str, Any]]:
    """The kept deliveries to run again: ``ids`` (each must be kept), or every one
    ``query`` matches (all its pages, oldest first, at most ``most``)."""
    if ids:
        return [show_delivery(settings, delivery_id) for delivery_id in ids]
    assert query is not None
    found: list[dict[str, Any]] = []
    before = query.before
    while len(found) < most:
        page = list_deliveries(
            settings,
            DeliveryQuery(
                query.sources, query.statuses, query.since_s, min(1000, most - len(found)), before
            ),
        )
        found.extend(page.entries)
        if page.next_before is None:
            break
        before = page.next_before
    found.reverse()  # oldest first: as their senders sent them
    return found


def rerun(
    settings: Settings,
    entries: list[dict[str, Any]],
    dry_run: bool,
    new_ids: bool,
    store: JournalStore | None = None,
) -> list[Rerun]:
    """Run each of ``entries`` (as :func:`~keylane.ops.deliveries.show_delivery` reads
    them) again; ``store``: the journal a dry run asks (required then)."""
    stamp = int(time.time() * 1000)
    rename = (lambda event_id: f"{event_id}:rerun-{stamp}") if new_ids else None
    return asyncio.run(_rerun_all(settings, entries, dry_run, rename, store))


async def _rerun_all(
    settings: Settings,
    entries: list[dict[str, Any]],
    dry_run: bool,
    rename: Rename | None,
    store: JournalStore | None,
) -> list[Rerun]:
    configured = load_sources(settings)
    named = {e["source"] for e in entries}
    picked = [s for s in configured.all() if s.name in named]
    sources = Sources(picked, list(configured.destinations.values()))
    queue = open_event_queue(settings)
    checks = {source.name: KeptCheck(source) for source in picked}
    receiver = Receiver(settings, sources, queue, verifiers=checks)
    archive = Archive(settings.archive_path)
    try:
        done = []
        for entry in entries:
            done.append(await _rerun_one(receiver, entry, dry_run, rename, store, archive))
        return done
    finally:
        await queue.close()


async def _rerun_one(
    receiver: Receiver,
    entry: dict[str, Any],
    dry_run: bool,
    rename: Rename | None,
    store: JournalStore | None,
    archive: Archive,
) -> Rerun:
    delivery, name = entry["id"], entry["source"]
    source = receiver.sources.get(name)
    if source is None:
        return Rerun(delivery, name, "cannot", reason=f"no source named {name!r} now")
    why = _why_not(entry)
    if why is not None:
        return Rerun(delivery, name, "cannot", reason=why)
    headers = {
        k.lower(): v for k, v in entry["headers"].items() if k.lower() not in DROPPED_HEADERS
    }
    body: bytes = entry["body"] or b""
    headers["content-length"] = str(len(body))
    query = entry["query"].encode()
    seen = Seen()
    read = await receiver.read(source, headers, body_of(body), entry["path"], query, seen)
    if isinstance(read, Answer):
        return _told(delivery, name, read)
    taken = read.events
    redacted = _reads_redacted(taken)
    if redacted is not None:
        return Rerun(delivery, name, "cannot", reason=redacted)
    if rename is not None:
        taken = [_renamed(t, rename) for t in taken]
    if dry_run:
        assert store is not None
        return Rerun(
            delivery, name, "mapped", events=_mapped(receiver, source, taken, store, archive)
        )
    # A delivery of its own, made from the kept one: its events carry a new delivery id
    # (and its request, as its source's window says), as a delivery's do.
    kept = kept_for(source, receiver.settings, taken, headers, entry["path"], query, seen)
    answer = await receiver.admit(source, taken, headers, kept)
    if answer.status >= 300:
        return _told(delivery, name, answer)
    return Rerun(delivery, name, "ran", answer.status, events=_results(answer, taken))


def _why_not(entry: dict[str, Any]) -> str | None:
    if not entry["sha256"] or not entry["verified"] or (entry["size"] and entry["body"] is None):
        return f"its body was {body_kept(entry)}"
    if entry["body_cut"]:
        return f"its body was cut at the bound ({entry['body_kept']} of {entry['size']} bytes kept)"
    return None


def _reads_redacted(taken: list[Intake | Ignored]) -> str | None:
    for item in taken:
        if isinstance(item, Intake) and REDACTED in (item.event_id, item.record_key):
            return (
                "its mapping reads a header or query parameter whose value was redacted "
                "when it was kept"
            )
    return None


def _renamed(item: Intake | Ignored, rename: Rename) -> Intake | Ignored:
    if isinstance(item, Ignored):
        return item
    return replace(item, event_id=rename(item.event_id))


def _mapped(
    receiver: Receiver,
    source: Any,
    taken: list[Intake | Ignored],
    store: JournalStore,
    archive: Archive,
) -> list[RerunEvent]:
    events = []
    for item in taken:
        if isinstance(item, Ignored):
            events.append(RerunEvent("ignored", item.event_type, reason=item.reason))
            continue
        event = receiver.event_of(source, item)
        rows = find_events(store, archive, item.event_id, source.name).found
        before = rows[0].row.get("outcome") if rows else None
        events.append(
            RerunEvent(
                "duplicate" if rows else "new",
                item.event_type,
                item.event_id,
                item.record_key,
                event.shard,
                item.changes,
                before=before,
            )
        )
    return events


def _results(answer: Answer, taken: list[Intake | Ignored]) -> list[RerunEvent]:
    """Each event's result, read from the answer (keylane's own: one body, or one per
    item of a batched delivery, in the order the items came)."""
    body = json.loads(answer.body)
    items = body.get("items", [body])
    replayed = (REPLAYED in answer.headers) and "items" not in body
    events = []
    for item, said in zip(taken, items, strict=True):
        if isinstance(item, Ignored):
            events.append(RerunEvent("ignored", item.event_type, reason=item.reason))
            continue
        status = said.get("status", "accepted")
        told = status not in ("accepted", "reused")
        if status == "reused":
            result = "reused"
        elif replayed or said.get("replayed") or told:
            result = "duplicate"
        else:
            result = "new"
        events.append(
            RerunEvent(
                result,
                item.event_type,
                item.event_id,
                item.record_key,
                said.get("shard"),
                item.changes,
                before=status if told else None,
            )
        )
    return events


def _told(delivery: str, source: str, answer: Answer) -> Rerun:
    try:
        said = json.loads(answer.body)
    except ValueError:
        said = {}
    if 200 <= answer.status < 300:  # a handshake's answer: nothing to run
        return Rerun(delivery, source, "cannot", answer.status, "a handshake: nothing to run again")
    detail = said.get("detail", answer.body.decode("utf-8", "replace"))
    reason = f"{said.get('error', 'refused')}: {detail}"
    return Rerun(delivery, source, "refused", answer.status, reason)


def public(done: Rerun) -> dict[str, Any]:
    """``done`` for JSON."""
    shown = asdict(done)
    shown["events"] = [{k: v for k, v in asdict(e).items() if v is not None} for e in done.events]
    return {k: v for k, v in shown.items() if v is not None}


def check_choice(ids: tuple[str, ...], filtered: bool) -> None:
    """Ids or a filter, not both and not neither (a bulk run is asked for by its filter)."""
    if ids and filtered:
        raise KeylaneError("give delivery IDs or a filter (--source, --status, --since), not both")
    if not ids and not filtered:
        raise KeylaneError(
            "give delivery IDs, or a filter (--source, --status, --since) to run every "
            "delivery it matches again"
        )
