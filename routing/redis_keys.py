"""Every Redis key keylane uses, under one configurable namespace.

kombu is given the same namespace as its ``global_keyprefix``, so a shard queue
``keylane.shard.07`` lives at ``<ns>:keylane.shard.07``, where Flower also finds it.
"""

import hashlib
from dataclasses import dataclass

from .hot_records import hot_record

#: Upper bounds (seconds) of the apply-latency histogram's buckets, the fields of
#: :attr:`RedisKeys.latency` (the lanes count into them, the metrics read them).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def latency_bucket(seconds: float) -> str:
    """The histogram field (its bucket's upper bound, or ``+Inf``) of a latency."""
    for bound in LATENCY_BUCKETS_S:
        if seconds <= bound:
            return repr(bound)
    return "+Inf"


#: How long an operator's message marker (:meth:`RedisKeys.once`) is kept: a second retry
#: of one dead letter within it queues nothing.
ONCE_MARKER_TTL_MS = 7 * 24 * 3600 * 1000
#: How long the marker of a message a lane sent (a merge step, a forwarded event) is kept:
#: long enough for the redelivery of a delivery that died before its acknowledgement (a
#: lease's takeover), short enough that an absorbed key's stream leaves few keys behind.
#: A send past it is queued again, and the journal of the lane that takes it applies it once.
SEND_MARKER_TTL_MS = 3600 * 1000

#: The remembered event ids (:meth:`RedisKeys.seen_ids`): how long one group of them
#: gathers ids before the next starts, and into how many groups by id (the slots) each
#: period is split. Both are the layout, not settings: a receiver finds a mark only where
#: one with the same values wrote it. A period's groups expire whole once its last id is
#: past its window, so expiry costs no command per id; a lookup reads one group of every
#: period of the window (7 for three days). A group holds ``rate x 12 h / 2,048`` ids of
#: its source: within Redis's compact encoding (listpack, 512 entries) up to ~24 events/s,
#: ~26 bytes an id; past it ~85 bytes an id, a hash table (ops/docs/benchmarks.md).
SEEN_PERIOD_MS = 12 * 3600 * 1000
SEEN_SLOTS = 2048


@hot_record
class SeenId:
    """Where a remembered event id lives: its slot (which group of a period) and its
    field there (8 more bytes of its digest), and an 8-byte digest of its body's digest,
    its value's first 8 bytes (what tells a duplicate from a reused id)."""

    slot: int
    field: bytes
    body: bytes


def seen_id(event_id: str, body_sha256: str = "") -> SeenId:
    """The compact form of a remembered event id and its body's SHA-256 (hex; none for a
    lookup of the id alone): 8 bytes of each digest are 2**-64 odds of taking one id or
    body for another, per lookup."""
    digest = hashlib.sha256(event_id.encode(), usedforsecurity=False).digest()
    slot = int.from_bytes(digest[:2], "big") % SEEN_SLOTS
    body = hashlib.blake2b(body_sha256.encode(), digest_size=8, usedforsecurity=False)
    return SeenId(slot, digest[2:10], body.digest())


#: What is kept with an in-flight message in its shard's deliveries hash, each as the field
#: ``<digest>:<note>`` (the lane scripts forget them all when the message is done).
MESSAGE_NOTES = ("error", "retries", "since", "write")


def message_digest(raw: bytes) -> str:
    """A message's field in its shard's delivery counts (what Lua's ``redis.sha1hex``
    gives, so scripts and Python name the same field)."""
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class RedisKeys:
    """Key names for one keylane deployment (one namespace)."""

    namespace: str = "keylane"

    def __post_init__(self) -> None:
        if not self.namespace or any(c in self.namespace for c in " {}*?[]"):
            raise ValueError(f"invalid namespace {self.namespace!r}")

    @property
    def prefix(self) -> str:
        """Prefix of every key, also kombu's ``global_keyprefix``."""
        return f"{self.namespace}:"

    def queue(self, queue_name: str) -> str:
        """The list holding a Celery queue's messages (kombu's layout, priority 0)."""
        return f"{self.prefix}{queue_name}"

    def record_prefix(self, shard: int) -> str:
        """Prefix of the lists of a shard's records: ``<prefix><record key>`` holds a
        record's admitted messages in accepted order (the head in flight while busy)."""
        return f"{self.prefix}rec:{shard}:"

    def record(self, shard: int, record_key: str) -> str:
        """The list of a record's admitted messages (see :meth:`record_prefix`)."""
        return f"{self.record_prefix(shard)}{record_key}"

    def ready(self, shard: int) -> str:
        """Sorted set record key -> ms (Redis clock) from which the record may be taken;
        a score in the future is a record that waits."""
        return f"{self.prefix}ready:{shard}"

    def busy(self, shard: int) -> str:
        """Hash record key -> ms it was taken: the shard's records in flight in a lane."""
        return f"{self.prefix}busy:{shard}"

    def waits(self, shard: int) -> str:
        """Hash record key -> why it waits (JSON: reason, error, attempts, since), for
        status."""
        return f"{self.prefix}waits:{shard}"

    @property
    def depth(self) -> str:
        """Hash shard -> admitted messages of the shard's records that are not held."""
        return f"{self.prefix}depth"

    def lease(self, shard: int) -> str:
        """The shard's lease: the owner's token, with a TTL."""
        return f"{self.prefix}lease:{shard}"

    def last_owner(self, shard: int) -> str:
        """The lease value of the shard's last owner, deleted when it releases cleanly:
        still present at the next acquisition means that owner's lease expired."""
        return f"{self.prefix}last-owner:{shard}"

    def fence(self, shard: int) -> str:
        """Counter of lease acquisitions: the fencing token, only ever grows."""
        return f"{self.prefix}fence:{shard}"

    def deliveries(self, shard: int) -> str:
        """Hash message digest -> times the message was handed to a lane, and the notes
        kept with it (``<digest>:<note>``, see :data:`MESSAGE_NOTES`)."""
        return f"{self.prefix}deliveries:{shard}"

    def dedupe(self, source: str, event_id: str) -> str:
        """An event id's dedupe mark as keylane up to 0.1.x wrote it (the body's digest
        and the first answer, one key an id): still read, never written, until the last
        one expires (CHANGELOG.md, "Upgrading"); :meth:`seen_ids` since."""
        return f"{self.prefix}seen:{source}:{event_id}"

    def seen_ids(self, source: str) -> str:
        """Prefix of the hashes of ``source``'s remembered event ids: ``<prefix><period>:
        <slot>`` holds the ids (:func:`seen_id`) accepted in period ``<period>`` (ms since
        the epoch // :data:`SEEN_PERIOD_MS`) whose slot is ``<slot>``, each field's value
        the body's digest (8 bytes) and when it was accepted (4 bytes, s since the epoch,
        big-endian); the hash expires whole when its period's last id is past its window
        (``producers/gateway/scripts/_seen.lua``)."""
        return f"{self.prefix}seen-ids:{source}:"

    def outcome(self, source: str, event_id: str) -> str:
        """An event's told outcome (JSON, ``routing/contract/outcomes.py``), written by the
        lane that decided it, kept ``KEYLANE_OUTCOME_KEEP_S`` (a replay after that is told
        again by its lane, from the journal)."""
        return f"{self.prefix}outcome:{source}:{event_id}"

    @property
    def outcomes(self) -> str:
        """The channel every told outcome is published on (the receivers' one
        subscription each, ``producers/outcome_waits.py``)."""
        return f"{self.prefix}outcomes"

    def reused(self, source: str, event_id: str, body_hash: str) -> str:
        """Marker that one reuse of an event id with another body was already recorded."""
        return f"{self.prefix}reused:{source}:{event_id}:{body_hash}"

    def hook_secret(self, source: str) -> str:
        """The secret a sender handed over in its handshake (Asana's ``X-Hook-Secret``),
        kept until an operator forgets it (``keylane sources forget-secret``)."""
        return f"{self.prefix}hook-secret:{source}"

    def door(self, source: str) -> str:
        """Stream of the deliveries the receiver turned away for ``source`` (a 4xx or 503),
        bounded by ``KEYLANE_DOOR_KEEP`` (``routing/contract/door.py``)."""
        return f"{self.prefix}door:{source}"

    @property
    def doorbell(self) -> str:
        """Pub/sub channel: a shard number is published when its queue gets a message."""
        return f"{self.prefix}doorbell"

    @property
    def layout(self) -> str:
        """The layout of this namespace's keys, as a number (absent: 1, keylane 0.1.0;
        ``routing/contract/wire.py``)."""
        return f"{self.prefix}layout"

    @property
    def members(self) -> str:
        """Sorted set worker-id -> last heartbeat (ms since epoch)."""
        return f"{self.prefix}members"

    def member(self, worker_id: str) -> str:
        """Hash describing one worker (host, pid, lanes, started)."""
        return f"{self.prefix}member:{worker_id}"

    @property
    def store_writer(self) -> str:
        """The worker process that writes to the deployment's SQLite store (SQLite takes
        one writer at a time), with a TTL that worker's heartbeat renews."""
        return f"{self.prefix}store-writer"

    @property
    def store_writer_last(self) -> str:
        """The last worker that claimed :attr:`store_writer`, deleted only when it
        releases: a claim that ran out while this is still set may belong to a paused
        process."""
        return f"{self.prefix}store-writer-last"

    @property
    def lease_log(self) -> str:
        """Stream of lease events (acquired, released, lost), for audits and tests."""
        return f"{self.prefix}lease-log"

    @property
    def retention(self) -> str:
        """Hash: the store's table sizes and oldest rows, and the last prune's figures,
        written by each prune (for ``keylane status`` and the metrics)."""
        return f"{self.prefix}retention"

    @property
    def backlog(self) -> str:
        """Hash source -> its events accepted and not finished yet (Redis broker): what
        fair admission weighs a source's share of the backlog by."""
        return f"{self.prefix}backlog"

    @property
    def counters(self) -> str:
        """Hash of monotonically increasing counters (accepted, conflicts, ...)."""
        return f"{self.prefix}counters"

    @property
    def latency(self) -> str:
        """Hash: the apply-latency histogram (bucket -> count, plus ``sum`` and ``count``)."""
        return f"{self.prefix}latency"

    @property
    def drained(self) -> str:
        """Hash shard -> messages acknowledged, from which the receiver computes drain
        rates (for ``Retry-After``)."""
        return f"{self.prefix}drained"

    @property
    def held(self) -> str:
        """Hash record key -> open dead-letter id, for sources whose policy holds the key
        (its later messages wait in the record's list until it is released)."""
        return f"{self.prefix}held"

    @property
    def destinations(self) -> str:
        """Set of destination names that have flow state (for status and metrics)."""
        return f"{self.prefix}destinations"

    def flow_calls(self, destination: str) -> str:
        """Sorted set of a destination's calls in flight: slot -> expiry (ms since epoch)."""
        return f"{self.prefix}flow:{destination}:calls"

    def flow_bucket(self, destination: str) -> str:
        """Hash of a destination's limits and token bucket (``max``, ``rate``, ``tokens``,
        ``ts``), the time it is paused until after a ``Retry-After`` (``paused``) and its
        adapted rate after a 429 (``adapted``, ``cut_rate``, ``cut_at``)."""
        return f"{self.prefix}flow:{destination}:bucket"

    def flow_admitted(self, destination: str) -> str:
        """Sorted set of a destination's successful calls of the last second (member ->
        ms since epoch), the measure of what it admits when it starts to refuse."""
        return f"{self.prefix}flow:{destination}:admitted"

    def flow_counters(self, destination: str) -> str:
        """Hash of a destination's counters (calls, done, waits, retries, ...)."""
        return f"{self.prefix}flow:{destination}:counters"

    @property
    def schedules(self) -> str:
        """Set of the scheduled jobs' names (for ``keylane schedules``, status, metrics)."""
        return f"{self.prefix}schedules"

    def schedule(self, job: str) -> str:
        """Hash: one scheduled job's state (definition, last tick, the run in progress and
        its fencing counter, the buffered tick, the last outcome, tick and run counters)."""
        return f"{self.prefix}schedule:{job}"

    def schedule_lease(self, job: str) -> str:
        """The lease of a job's run in progress: ``owner/token``, with a TTL the run's
        heartbeat renews. Absent while a run is marked in progress: its scheduler died."""
        return f"{self.prefix}schedule-lease:{job}"

    @property
    def schedule_log(self) -> str:
        """Stream of what the scheduler did with each tick and run (started, finished,
        interrupted, skipped, buffered, missed), in Redis's order: the runs' journal."""
        return f"{self.prefix}schedule-log"

    def once(self, marker: str) -> str:
        """Marker that an operator's message (e.g. the retry of one dead letter) was queued."""
        return f"{self.prefix}once:{marker}"

    def pattern(self) -> str:
        """SCAN pattern matching every key of this namespace."""
        return f"{self.prefix}*"
