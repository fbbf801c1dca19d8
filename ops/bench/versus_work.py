"""The workloads of the versus benchmark, and the exact check of what a system did with one.

An event adds ``amount`` to its record's ``total`` and appends its sequence number to the
record's ``seqs``, both in the one write of a read-modify-write. Sequence numbers rise
in send order, and each record's events are sent in order by one sender thread, so the
final record says exactly what happened to every event:

* **lost**: a sequence number missing from ``seqs`` (another writer's stale write
  replaced the record); *lost units* are those events' amounts;
* **double**: a sequence number found more than once (a duplicate delivery applied);
* **reordered**: an event applied after a later event of the same record (counting first
  occurrences only).

A record whose ``total`` is not the sum of the amounts its ``seqs`` list is *torn*: its
two fields were not written together. That would be a bug in this benchmark.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

WORKLOADS = ("wide", "skewed", "storm")
#: At least this many records in ``wide``.
WIDE_RECORDS = 1000
SKEWED_RECORDS = 10
#: Zipf exponent of ``skewed``: the hottest of 10 records gets about 40 % of the events.
ZIPF_S = 1.2
STORM_RECORDS = 100
#: Deliveries of each event in ``storm`` (the first and its duplicates, back to back).
STORM_DELIVERIES = 3
SEED = 20261203


@dataclass(frozen=True)
class Delivery:
    """One send of one event; duplicates share ``seq``."""

    index: int  # position in the workload's send order
    seq: int
    record: int
    amount: int


@dataclass(frozen=True)
class Workload:
    """What the senders send: unique events (by ``seq``) and their deliveries in order."""

    name: str
    records: int
    #: Per event, by ``seq``: its record and amount.
    event_records: tuple[int, ...]
    amounts: tuple[int, ...]
    deliveries: tuple[Delivery, ...]

    @property
    def events(self) -> int:
        """Unique events."""
        return len(self.amounts)

    @property
    def hottest(self) -> int:
        """Events of the record that has the most."""
        return max(Counter(self.event_records).values())

    def critical_path_s(self, latency_s: float) -> float:
        """No system that applies a record's events one at a time, in order, can finish
        sooner: the hottest record's events, each waiting ``latency_s``."""
        return self.hottest * latency_s

    def slots_bound_s(self, latency_s: float, slots: int) -> float:
        """Nor sooner than every event's wait spread over ``slots`` busy processes."""
        return self.events * latency_s / slots

    def seqs_by_record(self) -> dict[int, list[int]]:
        """Each record's events in send order."""
        out: dict[int, list[int]] = defaultdict(list)
        for seq, record in enumerate(self.event_records):
            out[record].append(seq)
        return dict(out)


def _amount(seq: int) -> int:
    return (seq * 7919) % 13 + 1


def _workload(name: str, records: int, event_records: list[int], copies: int = 1) -> Workload:
    amounts = tuple(_amount(seq) for seq in range(len(event_records)))
    deliveries = [
        Delivery(index, seq, record, amounts[seq])
        for index, (seq, record) in enumerate(
            (seq, record) for seq, record in enumerate(event_records) for _ in range(copies)
        )
    ]
    return Workload(name, records, tuple(event_records), amounts, tuple(deliveries))


def wide(events: int) -> Workload:
    """``events`` spread evenly over max(1000, events / 3) records, in a shuffled order."""
    records = max(WIDE_RECORDS, math.ceil(events / 3))
    event_records = [i % records for i in range(events)]
    random.Random(SEED).shuffle(event_records)
    return _workload("wide", records, event_records)


def zipf_counts(events: int, records: int, s: float) -> list[int]:
    """``events`` split over ``records`` in proportion to 1/k^s (largest remainders)."""
    weights = [1 / (k**s) for k in range(1, records + 1)]
    shares = [events * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in shares]
    by_remainder = sorted(range(records), key=lambda k: counts[k] - shares[k])
    for k in by_remainder[: events - sum(counts)]:
        counts[k] += 1
    return counts


def skewed(events: int) -> Workload:
    """``events`` over 10 records, Zipf-distributed (s = 1.2), in a shuffled order."""
    counts = zipf_counts(events, SKEWED_RECORDS, ZIPF_S)
    event_records = [record for record, n in enumerate(counts) for _ in range(n)]
    random.Random(SEED).shuffle(event_records)
    return _workload("skewed", SKEWED_RECORDS, event_records)


def storm(events: int) -> Workload:
    """``events`` over 100 records, each delivered 3 times back to back by its sender,
    as a provider does that retries on a slow answer."""
    event_records = [i % STORM_RECORDS for i in range(events)]
    random.Random(SEED).shuffle(event_records)
    return _workload("storm", STORM_RECORDS, event_records, STORM_DELIVERIES)


def make_workload(name: str, events: int) -> Workload:
    """The workload called ``name``."""
    makers = {"wide": wide, "skewed": skewed, "storm": storm}
    return makers[name](events)


def sender_of(record: int, senders: int) -> int:
    """The one sender thread that sends every event of ``record``, in order."""
    return record % senders


# -- the check ------------------------------------------------------------------------------


@dataclass
class Effects:
    """What the records say happened to the workload's events."""

    lost_events: int = 0
    lost_units: int = 0
    reordered: int = 0
    double: int = 0
    torn_records: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Every event applied exactly once, in order."""
        return not (
            self.lost_events or self.reordered or self.double or self.torn_records or self.problems
        )


def check_effects(work: Workload, found: Mapping[int, tuple[int, list[int]]]) -> Effects:
    """Compare each record as found (``total``, ``seqs``; absent records missing from
    ``found``) with the workload applied once, in order."""
    effects = Effects()
    for record, expected in work.seqs_by_record().items():
        total, seqs = found.get(record, (0, []))
        _check_record(work, record, expected, total, seqs, effects)
    return effects


def _check_record(
    work: Workload, record: int, expected: list[int], total: int, seqs: list[int], out: Effects
) -> None:
    mine = set(expected)
    strangers = [s for s in seqs if s not in mine]
    if strangers:
        out.problems.append(f"record {record} holds events of other records: {strangers[:5]}")
        return
    if total != sum(work.amounts[s] for s in seqs):
        out.torn_records += 1
    counts = Counter(seqs)
    out.double += sum(n - 1 for n in counts.values())
    missing = mine - counts.keys()
    out.lost_events += len(missing)
    out.lost_units += sum(work.amounts[s] for s in missing)
    out.reordered += count_reordered(dict.fromkeys(seqs))


def count_reordered(seqs: Iterable[int]) -> int:
    """Events applied after an event sent later than them."""
    latest, late = -1, 0
    for seq in seqs:
        if seq < latest:
            late += 1
        latest = max(latest, seq)
    return late
