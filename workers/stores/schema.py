"""The store's tables, written once; each dialect names its own column types.

``migrate()`` runs this text as it is: every statement is ``CREATE ... IF NOT EXISTS``,
so it creates a new database and leaves an existing one as it finds it (adding what a
newer version needs: the indexes the prune reads by age, the archived ids).

``parked`` holds the waiting messages of records that must wait longer than the broker
may hold a delivery (RabbitMQ), base64-encoded, in order per record. ``held`` holds the
records of those brokers that wait behind a dead letter (a source's ``hold`` policy): their
parked messages are not due until the row is closed or retried.

``tries`` counts the tries of messages a broker handed out again, for a broker whose
own count also counts deliveries no lane tried (RabbitMQ; :mod:`.sql_tries`).

``identities`` is the identity index (``kind:value`` -> the record it names), written by
the lanes with the record's write; ``kept_apart`` holds the pairs of records a person said
are two (a merge of them is never proposed again), the lower key first.

``deliveries`` holds the accepted deliveries a source keeps (``keep_deliveries``), one
row per delivery id, its request as JSON (:mod:`keylane.routing.contract.kept_deliveries`),
written by the lane that applies one of its events; its events' journal rows name it
(``journal.delivery``).

``archived_ids`` is what remains in the store of a journal row once it is archived: a
64-bit hash of its ``(source, event id)`` and the second it was recorded, so that a
delivery replayed after its row left the table is still recognised (see
:mod:`.journal`) until ``archived_id_retention_s`` has passed. On SQLite the hash is the
table's rowid: about 40 bytes per id with its age index, against a few hundred for a
journal row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ColumnTypes:
    """A dialect's names for the column types the schema uses."""

    bigint: str  # revisions, fencing tokens, row ids
    real: str  # times, in seconds since the epoch
    json: str  # fields and review payloads, stored as the text written
    serial_key: str  # a primary key the database numbers itself


_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY,
    fields {json} NOT NULL,
    revision {bigint} NOT NULL,
    updated_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    record_key TEXT NOT NULL,
    shard INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    revision {bigint},
    attempts INTEGER NOT NULL,
    recorded_at {real} NOT NULL,
    fence {bigint},
    result TEXT,
    PRIMARY KEY (source, event_id)
);
CREATE INDEX IF NOT EXISTS journal_record ON journal (record_key);
CREATE INDEX IF NOT EXISTS journal_age ON journal (source, recorded_at);
CREATE TABLE IF NOT EXISTS archived_ids (
    id_hash {bigint} PRIMARY KEY,
    recorded_at {bigint} NOT NULL
);
CREATE INDEX IF NOT EXISTS archived_ids_age ON archived_ids (recorded_at);
CREATE TABLE IF NOT EXISTS shard_fences (
    shard INTEGER PRIMARY KEY,
    token {bigint} NOT NULL,
    updated_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id {serial_key},
    created_at {real} NOT NULL,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    record_key TEXT NOT NULL,
    shard INTEGER NOT NULL,
    reason TEXT NOT NULL,
    event {json} NOT NULL,
    attempted_change {json} NOT NULL,
    revision_read {bigint},
    revision_found {bigint},
    attempts INTEGER NOT NULL,
    error TEXT NOT NULL,
    status TEXT NOT NULL,
    status_by TEXT,
    status_at {real},
    note TEXT,
    retry_of {bigint}
);
CREATE INDEX IF NOT EXISTS dead_letters_status ON dead_letters (status, created_at);
CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (record_key);
CREATE INDEX IF NOT EXISTS dead_letters_event ON dead_letters (source, event_id);
CREATE TABLE IF NOT EXISTS parked (
    shard INTEGER NOT NULL,
    record_key TEXT NOT NULL,
    seq {bigint} NOT NULL,
    message TEXT NOT NULL,
    deliveries INTEGER NOT NULL,
    due_at {real} NOT NULL,
    parked_at {real} NOT NULL,
    PRIMARY KEY (shard, record_key, seq)
);
CREATE TABLE IF NOT EXISTS identities (
    identity TEXT PRIMARY KEY,
    record_key TEXT NOT NULL,
    claimed_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS identities_record ON identities (record_key);
CREATE TABLE IF NOT EXISTS kept_apart (
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    kept_by TEXT NOT NULL,
    kept_at {real} NOT NULL,
    PRIMARY KEY (a, b)
);
CREATE TABLE IF NOT EXISTS tries (
    shard INTEGER NOT NULL,
    digest TEXT NOT NULL,
    tries INTEGER NOT NULL,
    tried_at {real} NOT NULL,
    PRIMARY KEY (shard, digest)
);
CREATE INDEX IF NOT EXISTS tries_age ON tries (tried_at);
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    received_at {real} NOT NULL,
    request {json} NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_age ON deliveries (source, received_at);
CREATE TABLE IF NOT EXISTS held (
    shard INTEGER NOT NULL,
    record_key TEXT NOT NULL,
    dead_letter_id {bigint} NOT NULL,
    held_at {real} NOT NULL,
    PRIMARY KEY (shard, record_key)
);
"""


#: Columns added since a table was first created: (table, column, its DDL). ``migrate()``
#: adds each one a database lacks (``CREATE TABLE IF NOT EXISTS`` leaves an old table as
#: it is). ``journal.result``: an event's result as JSON text, or NULL;
#: ``records.created_at``: when the record was first written (NULL: before this column);
#: ``records.merged_into``: the record that absorbed this one (a tombstone), or NULL;
#: ``records.kept_for``: the task whose record elsewhere this row of no fields stands for
#: (its key's creation time and tombstone), or NULL for keylane's own records;
#: ``journal.via``: the record key a forwarded event was sent to (it applied to the record
#: that absorbed that one), or NULL; ``journal.delivery``: the id of the delivery the
#: event came from (``SOURCE/MS-SEQ``), or NULL (sent from Python, or before this column).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("journal", "result", "result TEXT"),
    ("records", "created_at", "created_at {real}"),
    ("records", "merged_into", "merged_into TEXT"),
    ("records", "kept_for", "kept_for TEXT"),
    ("journal", "via", "via TEXT"),
    ("journal", "delivery", "delivery TEXT"),
)

#: Indexes on added columns, made once the columns are there (``migrate()`` runs this after
#: :data:`ADDED_COLUMNS`). ``journal_via``: ``journal find --key`` of an absorbed key finds
#: the events forwarded from it; few rows are forwarded, so it holds only those.
ADDED_INDEXES = (
    "CREATE INDEX IF NOT EXISTS journal_via ON journal (via) WHERE via IS NOT NULL;\n"
    "CREATE INDEX IF NOT EXISTS journal_delivery ON journal (delivery) "
    "WHERE delivery IS NOT NULL;"
)


def added_columns(types: ColumnTypes) -> list[tuple[str, str, str]]:
    """:data:`ADDED_COLUMNS` in a dialect's type names."""
    return [(table, column, ddl.format(real=types.real)) for table, column, ddl in ADDED_COLUMNS]


def schema_ddl(types: ColumnTypes) -> str:
    """The schema's DDL in a dialect's type names."""
    return _SCHEMA.format(
        bigint=types.bigint, real=types.real, json=types.json, serial_key=types.serial_key
    )
