"""The user's own PostgreSQL table: the one module of the resources that imports psycopg.

A row per record key (``key_column``, with a unique index), a version column the user
names: an integer revision (``version_kind = "integer"``, advanced by one on every write)
or a timestamp (``"timestamp"``, an ``updated_at`` set to the clock, and always forward).
Fields map to columns (``columns``). Each write is one statement, in autocommit:

* create: ``INSERT ... ON CONFLICT DO NOTHING RETURNING version`` (no row back: someone
  created it first);
* update: ``UPDATE ... SET <changed columns>, version = <next> WHERE key = %s AND
  version = %s RETURNING version`` (no row back: the row moved on).

Only the changed columns are written, so a concurrent edit of any other column stands.
keylane never alters the table: at start-up it checks that the columns and the unique
key exist and refuses to start, naming what is missing. Every other writer of the table
must advance the version column too (a trigger can); a write that does not is not seen.
A resource object holds one connection and is used by one thread at a time.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ...routing.contract.errors import (
    ConfigError,
    ResourceRefused,
    ResourceUnavailable,
    WriteConflict,
    WriteOutcomeUnknown,
)
from ...routing.contract.resources import PgTableResourceConfig, render_key_template
from ..resource import Snapshot, Version

_INTEGER_TYPES = ("smallint", "integer", "bigint", "numeric")
_TIMESTAMP_TYPES = ("timestamp with time zone", "timestamp without time zone")
_JSON_TYPES = ("json", "jsonb")

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = %(table)s::regclass AND a.attnum > 0
AND NOT a.attisdropped
"""
_UNIQUE_KEY = """
SELECT 1 FROM pg_index i JOIN pg_attribute a
  ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = %(table)s::regclass AND i.indisunique AND i.indnkeyatts = 1
  AND i.indpred IS NULL AND a.attname = %(column)s
"""


class PgTableResource:
    """A :class:`~keylane.workers.resource.VersionedResource` in a PostgreSQL table."""

    def __init__(
        self,
        config: PgTableResourceConfig,
        environ: Mapping[str, str],
        connect_timeout_s: int = 5,
    ) -> None:
        self.config = config
        self._url = config.url(environ)
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        schema, name = config.schema_and_table
        self._table = sql.Identifier(schema, name) if schema else sql.Identifier(name)
        try:
            self._types = self._check_table()
        except ConfigError:
            self.close()
            raise
        self._key = sql.Identifier(config.key_column)
        self._version = sql.Identifier(config.version_column)
        self._names = {"table": self._table, "key": self._key, "version": self._version}
        self._read = sql.SQL("SELECT {version}, {columns} FROM {table} WHERE {key} = %s").format(
            version=self._version,
            columns=sql.SQL(", ").join(sql.Identifier(c) for c in config.columns.values()),
            table=self._table,
            key=self._key,
        )

    def read(self, key: str) -> Snapshot:
        """The row of ``key`` (absent when there is none)."""
        try:
            row = self._connection().execute(self._read, (self._key_value(key),)).fetchone()
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None
        except psycopg.Error as exc:
            raise ResourceRefused(f"{self.config.table}: {exc}") from None
        if row is None:
            return Snapshot({}, None)
        if row[0] is None:
            raise ResourceRefused(f"{key}: {self.config.version_column} is NULL in its row")
        fields = {
            field: _from_column(value)
            for field, value in zip(self.config.columns, row[1:], strict=True)
            if value is not None
        }
        return Snapshot(fields, _version_out(row[0]), row)

    def create(self, key: str, fields: Mapping[str, Any]) -> Version | None:
        """Insert the row if there is none."""
        columns = [self._column(f) for f in fields]
        statement = sql.SQL(
            "INSERT INTO {table} ({key}, {version}, {columns}) VALUES (%s, {first}, {values}) "
            "ON CONFLICT DO NOTHING RETURNING {version}"
        ).format(
            **self._names,
            columns=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            first=sql.SQL("1" if self.config.version_kind == "integer" else "clock_timestamp()"),
            values=sql.SQL(", ").join(sql.Placeholder() for _ in columns),
        )
        params = [self._key_value(key), *self._values(columns, fields.values())]
        return self._write(statement, params, f"{key}: created by someone else")

    def update(self, key: str, fields: Mapping[str, Any], read: Snapshot) -> Version | None:
        """Set the changed columns if the row is still at ``read.version``."""
        columns = [self._column(f) for f in fields]
        statement = sql.SQL(
            "UPDATE {table} SET {sets}, {version} = {next} "
            "WHERE {key} = %s AND {version} = %s RETURNING {version}"
        ).format(
            **self._names,
            sets=sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns),
            next=self._next_version(),
        )
        params = [
            *self._values(columns, fields.values()),
            self._key_value(key),
            _version_in(read.version),
        ]
        return self._write(statement, params, f"{key}: no longer at {read.version!r}")

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _write(self, statement: sql.Composed, params: list[Any], conflict: str) -> Version:
        conn = self._connection()  # no connection: nothing was sent
        try:
            row = conn.execute(statement, params).fetchone()
        except psycopg.OperationalError as exc:
            self.close()
            raise WriteOutcomeUnknown(f"{self.config.table}: {exc}") from None
        except psycopg.Error as exc:
            raise ResourceRefused(f"{self.config.table}: {exc}") from None
        if row is None:
            raise WriteConflict(conflict)
        return _version_out(row[0])

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                self._conn = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=self._connect_timeout_s
                )
            except psycopg.OperationalError as exc:
                raise self._unavailable(exc) from None
        return self._conn

    def _unavailable(self, exc: psycopg.Error) -> ResourceUnavailable:
        self.close()
        return ResourceUnavailable(f"{self.config.table}: {type(exc).__name__}: {exc}")

    def _check_table(self) -> dict[str, str]:
        """The table's column types; ``ConfigError`` when the table, a column or the
        unique key is missing, or the version column has the wrong type."""
        where = f"table {self.config.table}"
        try:
            conn = self._connection()
            table = self._table.as_string(conn)
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() in (None, (None,)):
                raise ConfigError(f"{where} does not exist (keylane never creates it)")
            types = dict(conn.execute(_COLUMNS, {"table": table}).fetchall())
            column = self.config.key_column
            unique = conn.execute(_UNIQUE_KEY, {"table": table, "column": column}).fetchone()
        except ResourceUnavailable as exc:
            raise ConfigError(f"{where}: cannot connect: {exc}") from None
        except psycopg.Error as exc:
            raise ConfigError(f"{where}: {exc}") from None
        self._check_columns(where, types, unique is not None)
        return types

    def _check_columns(self, where: str, types: dict[str, str], unique: bool) -> None:
        config = self.config
        named = [config.key_column, config.version_column, *config.columns.values()]
        missing = [c for c in named if c not in types]
        if missing:
            raise ConfigError(f"{where} has no column(s) {', '.join(missing)}")
        if not unique:
            raise ConfigError(f"{where}: {config.key_column} needs a unique index of its own")
        kind = config.version_kind
        allowed = _INTEGER_TYPES if kind == "integer" else _TIMESTAMP_TYPES
        if types[config.version_column] not in allowed:
            raise ConfigError(
                f"{where}: version_kind = {kind!r} needs {config.version_column} to be one of "
                f"{', '.join(allowed)}, not {types[config.version_column]}"
            )

    def _next_version(self) -> sql.Composable:
        if self.config.version_kind == "integer":
            return sql.SQL("{} + 1").format(self._version)
        cast = sql.SQL(self._types[self.config.version_column])
        return sql.SQL("GREATEST(clock_timestamp()::{}, {} + interval '1 microsecond')").format(
            cast, self._version
        )

    def _column(self, field: str) -> str:
        column = self.config.columns.get(field)
        if column is None:
            raise ResourceRefused(f"field {field!r} has no column in {self.config.table}")
        return column

    def _values(self, columns: list[str], values: Any) -> list[Any]:
        return [
            Jsonb(v) if v is not None and self._types[c] in _JSON_TYPES else v
            for c, v in zip(columns, values, strict=True)
        ]

    def _key_value(self, key: str) -> str:
        try:
            return render_key_template(self.config.key, key, url=False)
        except ValueError as exc:
            raise ResourceRefused(str(exc)) from None


def _version_out(value: Any) -> Version:
    """A version as keylane carries it: an int, or a timestamp as ISO 8601 text."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return int(value)


def _version_in(version: Version | None) -> Any:
    return dt.datetime.fromisoformat(version) if isinstance(version, str) else version


def _from_column(value: Any) -> Any:
    """A column's value as JSON carries it."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value
