"""The review rows' queries: read, filter, move through their lifecycle, count."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from keylane.workers.stores.base import DeadLetter, DeadLetterFilter, DeadLetterStatus
from keylane.workers.stores.sql_base import SqlBase

_DL_COLUMNS = (
    "id, created_at, source, event_id, record_key, shard, reason, {event}, {change}, "
    "revision_read, revision_found, attempts, error, status, status_by, status_at, note, retry_of"
)


class ReviewSql(SqlBase):
    """Dead-letter rows, read side (written by :meth:`SqlStore.commit_dead_letter`)."""

    def _dl_select(self) -> str:
        cols = _DL_COLUMNS.format(
            event=self.json_out("event"), change=self.json_out("attempted_change")
        )
        return f"SELECT {cols} FROM dead_letters"

    @staticmethod
    def _dl_row(row: Sequence[Any]) -> DeadLetter:
        return DeadLetter(
            id=int(row[0]),
            created_at=float(row[1]),
            source=row[2],
            event_id=row[3],
            record_key=row[4],
            shard=int(row[5]),
            reason=row[6],
            event=json.loads(row[7]),
            attempted_change=json.loads(row[8]),
            revision_read=row[9],
            revision_found=row[10],
            attempts=int(row[11]),
            error=row[12],
            status=row[13],
            status_by=row[14],
            status_at=row[15],
            note=row[16],
            retry_of=row[17],
        )

    def dead_letter(self, dead_letter_id: int) -> DeadLetter | None:
        with self._cursor() as cur:
            cur.execute(self._q(self._dl_select() + " WHERE id = ?"), (dead_letter_id,))
            row = cur.fetchone()
        return self._dl_row(row) if row else None

    def dead_letters(self, flt: DeadLetterFilter) -> list[DeadLetter]:
        where, params = _dl_where(flt, time.time())
        sql = self._dl_select() + where + " ORDER BY id"
        if flt.limit is not None:
            sql += " LIMIT ?"
            params.append(flt.limit)
        with self._cursor() as cur:
            cur.execute(self._q(sql), params)
            return [self._dl_row(r) for r in cur.fetchall()]

    def set_dead_letter_status(
        self,
        dead_letter_id: int,
        to: DeadLetterStatus,
        allowed_from: tuple[str, ...],
        by: str,
        note: str | None = None,
    ) -> bool:
        if not allowed_from:
            return False
        marks = ", ".join("?" for _ in allowed_from)
        with self._transaction() as cur:
            cur.execute(
                self._q(
                    "UPDATE dead_letters SET status = ?, status_by = ?, status_at = ?, "
                    f"note = COALESCE(?, note) WHERE id = ? AND status IN ({marks})"
                ),
                (to, by, time.time(), note, dead_letter_id, *allowed_from),
            )
            return cur.rowcount == 1

    def dead_letter_stats(self) -> list[dict[str, Any]]:
        with self._cursor() as cur:
            cur.execute(
                "SELECT status, reason, source, COUNT(*), MIN(created_at) FROM dead_letters "
                "GROUP BY status, reason, source ORDER BY status, reason, source"
            )
            rows = cur.fetchall()
        return [
            {
                "status": r[0],
                "reason": r[1],
                "source": r[2],
                "count": int(r[3]),
                "oldest": float(r[4]),
            }
            for r in rows
        ]


def _dl_where(flt: DeadLetterFilter, now: float) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []

    def any_of(column: str, values: tuple[Any, ...]) -> None:
        if values:
            clauses.append(f"{column} IN ({', '.join('?' for _ in values)})")
            params.extend(values)

    any_of("status", flt.statuses)
    any_of("reason", flt.reasons)
    any_of("source", flt.sources)
    any_of("id", flt.ids)
    if flt.record_key is not None:
        clauses.append("record_key = ?")
        params.append(flt.record_key)
    if flt.older_than_s is not None:
        clauses.append("created_at <= ?")
        params.append(now - flt.older_than_s)
    if flt.newer_than_s is not None:
        clauses.append("created_at >= ?")
        params.append(now - flt.newer_than_s)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
