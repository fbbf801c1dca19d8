"""``keylane audit``: evidence, from durable records, that no shard ever had two owners.

Two independent checks:

* the lease log (a Redis stream written by the lease scripts themselves): per shard,
  fencing tokens only grow; a lease is acquired only when the previous one was released,
  or when it had expired (the acquisition then names the expired holder); a release
  always names the current holder;
* the store's journal: per record, in revision order (the order the store committed the
  writes), the fencing token under which each event was written never goes down, so no
  older owner wrote after a newer one.

And one check of a count kept by hand (on Redis): each shard's figure in the ``depth`` hash,
which the lane scripts adjust message by message, against the records' lists it summarizes
(read at one instant; a difference is reported, nothing is repaired).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from ..routing.contract.settings import Settings
from ..workers.store_rows import JournalEntry
from .views import open_view


def audit_lease_log(events: Iterable[dict[str, str]]) -> list[str]:
    """Problems found in the lease log (empty when every handoff is clean)."""
    problems: list[str] = []
    holder: dict[str, str | None] = {}
    last_token: dict[str, int] = defaultdict(int)
    for e in events:
        shard, kind = e["shard"], e["event"]
        value = f"{e['worker']}/{e['token']}"
        token = int(e["token"])
        if kind == "acquired":
            if token <= last_token[shard]:
                problems.append(
                    f"shard {shard}: token {token} after {last_token[shard]} ({e['id']})"
                )
            current = holder.get(shard)
            expired = e.get("expired", "")
            if current is not None and expired != current:
                problems.append(
                    f"shard {shard}: {value} acquired while {current} held it ({e['id']})"
                )
            holder[shard] = value
            last_token[shard] = max(token, last_token[shard])
        elif kind in ("released", "abandoned", "stuck"):
            if shard in holder and holder[shard] != value:
                problems.append(
                    f"shard {shard}: {value} released a lease held by {holder[shard]} ({e['id']})"
                )
            holder[shard] = None
    return problems


def audit_journal(entries: Iterable[JournalEntry]) -> list[str]:
    """Problems found in the journal: a write under an older fence after a newer one."""
    problems: list[str] = []
    newest: dict[str, tuple[int, int]] = {}
    for entry in entries:
        if entry.outcome != "applied" or entry.fence is None or entry.revision is None:
            continue
        seen = newest.get(entry.record_key)
        if seen is not None and entry.fence < seen[0]:
            problems.append(
                f"record {entry.record_key}: revision {entry.revision} written under fence "
                f"{entry.fence} after revision {seen[1]} under fence {seen[0]}"
            )
        if seen is None or entry.fence >= seen[0]:
            newest[entry.record_key] = (entry.fence, entry.revision)
    return problems


def admitted_counts(settings: Settings) -> dict[int, tuple[int, int]]:
    """Per shard of the deployment's Redis: admitted messages as the ``depth`` hash counts
    them, and as the records' lists hold them (read only)."""
    view = open_view(settings)
    try:
        return view.admitted_counts()
    finally:
        view.close()


def audit_depth(counts: Mapping[int, tuple[int, int]]) -> list[str]:
    """Problems found in the ``depth`` hash: a shard whose count is not what its records'
    lists hold (what backpressure and ``keylane status`` read would be wrong)."""
    return [
        f"shard {shard}: the depth hash counts {counted} admitted messages, "
        f"its records' lists hold {listed}"
        for shard, (counted, listed) in sorted(counts.items())
        if counted != listed
    ]
