"""The write path: one commit of a lane (an event's write, or a record's batch) in the
caller's transaction: the fence check, the record's conditional write, what a merge step
changes besides the record (identities, a tombstone, a reopen), and each event's journal
entry, after the record, so that a duplicate is refused there and rolls the write back."""

from __future__ import annotations

from ..store_rows import Commit, with_revision
from .dialect import Cursor, Dialect
from .sql_deliveries import keep_delivery
from .sql_fences import check_fence
from .sql_identities import claim_identities, keep_apart, move_identities, return_identities
from .sql_journal import record_outcome
from .sql_records import check_revision, close_record, keep_key, reopen_record, write_record


def commit_writes(d: Dialect, cur: Cursor, commit: Commit) -> int:
    """Write ``commit`` (see :meth:`RecordStore.commit_group`); the record's revision."""
    writes = commit.writes
    first = writes[0]
    fields = next((w.fields for w in reversed(writes) if w.fields is not None), None)
    check_fence(d, cur, commit.fence)
    revision = first.expected_revision
    if fields is not None:
        revision = write_record(d, cur, first.record_key, fields, revision)
    elif first.decided_on_read:  # a refusal decided on that revision: still there?
        check_revision(cur, first.record_key, revision)
    elif first.keeps_key is not None:
        keep_key(d, cur, first.record_key, first.keeps_key)
    claimed = tuple(dict.fromkeys(i for write in writes for i in write.identities))
    if claimed:  # the batch's identities, once, in the write's transaction
        claim_identities(cur, first.record_key, claimed)
    for write in writes:  # what a merge changes besides the record, in its transaction
        if write.absorbs is not None:
            move_identities(cur, write.absorbs, write.record_key)
        if write.merged_into is not None:
            close_record(cur, write.record_key, write.merged_into)
        if write.reopens is not None:
            reopen_record(cur, write.record_key)
            keep_apart(cur, write.record_key, write.reopens, "merge undone")
        if write.releases is not None:
            return_identities(cur, write.record_key, *write.releases)
    # After the record: a duplicate is then refused here and rolls the write back.
    for write in writes:
        changed = write.fields is not None
        record_outcome(
            cur,
            source=write.source,
            event_id=write.event_id,
            record_key=write.record_key,
            shard=write.shard,
            outcome=write.outcome,
            attempts=write.attempts,
            fence=commit.fence,
            retry_of=write.retry_of,
            revision=revision if changed or write.outcome == "refused" else None,
            result=with_revision(write.result, revision) if changed else write.result,
            via=write.via,
            delivery=write.delivery,
        )
        if write.kept_request is not None and write.delivery is not None:
            keep_delivery(d, cur, write.delivery, write.source, write.kept_request)
    return revision
