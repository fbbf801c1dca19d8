"""Records listed by a query (``keylane records list``): a key prefix, fields equal to
values, keyset pages by key.

The fields are compared in SQL (each dialect's JSON functions: :meth:`Dialect.field_equals`)
and again here, as JSON compares them (:func:`same_json`): the SQL narrows the rows read,
this decides. Where SQL cannot compare as JSON does (an object or an array on SQLite,
whose ``1.0`` inside is not ``1`` to it), it lets every value of that kind through and
this drops those that differ; a page that loses rows that way reads on until it is full,
so a page is short only when it is the last.
"""

from __future__ import annotations

from typing import Any

from ..store_rows import Record, RecordPage, RecordQuery
from .dialect import Cursor, Dialect, dump_json
from .sql_records import record_columns, record_of


def list_records(d: Dialect, cur: Cursor, query: RecordQuery) -> RecordPage:
    """A page of ``query``: up to ``query.limit`` records in key order, and the key the
    next page starts after when there are more (one record past the page is read to know)."""
    found: list[Record] = []
    after = query.after
    wanted = query.limit + 1
    while len(found) < wanted:
        asked = wanted - len(found)
        batch = _read(d, cur, query, after, asked)
        found.extend(r for r in batch if _matches(r, query.where))
        if len(batch) < asked:
            break
        after = batch[-1].key
    page = found[: query.limit]
    more = len(found) > query.limit
    return RecordPage(page, page[-1].key if more and page else None)


def _read(d: Dialect, cur: Cursor, query: RecordQuery, after: str, limit: int) -> list[Record]:
    # (every key with the prefix sorts at or after it: the key index starts the scan there)
    conditions = ["key > ?", "key >= ?", "substr(key, 1, ?) = ?"]
    params: list[Any] = [after, query.prefix, len(query.prefix), query.prefix]
    if not query.merged:
        conditions.append("merged_into IS NULL")
    for name, value in query.where:
        sql, values = d.field_equals("fields", name, dump_json(value))
        conditions.append(sql)
        params.extend(values)
    cur.execute(
        f"SELECT {record_columns(d)} FROM records WHERE {' AND '.join(conditions)} "
        "ORDER BY key LIMIT ?",
        (*params, limit),
    )
    return [record_of(row) for row in cur.fetchall()]


def _matches(record: Record, where: tuple[tuple[str, Any], ...]) -> bool:
    return all(name in record.fields and same_json(record.fields[name], v) for name, v in where)


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value: numbers by value (``1`` is
    ``1.0``), ``true`` never ``1``, objects whatever the order of their keys."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
