"""The archive: rows that left the store's tables (and the lease log), as gzipped JSON
lines, one folder per table and UTC day::

    <archive dir>/journal/2026-12-02/103000-3f2a9c1b.jsonl.gz
    <archive dir>/deliveries/2026-12-02/...   (accepted deliveries kept, by source)
    <archive dir>/dead_letters/2026-11-02/...
    <archive dir>/lease_log/2026-11-25/...

A file is written whole before any of its rows is deleted, and named for what it is:

* ``.<name>.tmp``: being written; a crash leaves it incomplete, and the next run deletes
  it (its rows are all still in the table);
* ``<name>.jsonl.gz.pending``: complete and on disk (fsynced, then renamed), its rows
  perhaps still in the table too: the prune deletes them (each only if unchanged), then
* ``<name>.jsonl.gz``: settled — every row in it is gone from the table, and every row
  that stayed (it changed meanwhile) was taken out of the file first.

A run that finds ``.pending`` files settles them before anything else, so a prune killed
at any point leaves each row in the table or in a complete file, and the next run leaves
it in exactly one of them. Lines are compact JSON with sorted keys (one row each), so
``zgrep '"event_id":"evt_1"'`` finds a row too.
"""

from __future__ import annotations

import gzip
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NoReturn

from ..routing.contract.errors import ConfigError
from ..routing.contract.faults import NO_FAULTS, Faults
from ..workers.store_rows import ArchiveRow
from ..workers.stores.dialect import dump_json

SETTLED = ".jsonl.gz"
PENDING = ".jsonl.gz.pending"
TABLES = ("journal", "deliveries", "dead_letters", "lease_log")


def day_of(ts: float) -> str:
    """The UTC day (``YYYY-MM-DD``) a time falls on: the archive folder of its rows."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


class Archive:
    """The archive folder of a deployment (``KEYLANE_ARCHIVE_DIR``). ``faults`` are
    for crash tests (``prune.before_rename``: a file written but not yet named)."""

    def __init__(self, root: Path, faults: Faults = NO_FAULTS) -> None:
        self.root = root
        self.faults = faults

    def check_usable(self, dry_run: bool = False) -> None:
        """:class:`ConfigError` when the archive folder cannot be one: it, or the nearest
        of its parents that exists, is not a folder, or it cannot be made or written in
        (a read-only file system, a path under ``/proc``). Checked before a prune touches
        anything, so a wrong ``KEYLANE_ARCHIVE_DIR`` is one line, not a traceback; a dry
        run makes nothing, and checks only what it can without writing."""
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            what = "is" if existing == self.root else f"is under {existing}, which is"
            self._refuse(f"{what} not a folder")
        if dry_run:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # The prune writes a file in a folder per table and day: one written and
            # removed here says whether it can, before any row is read.
            probe = self.root / f".probe-{uuid.uuid4().hex[:8]}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            self._refuse(f"cannot be written ({exc.strerror or exc})")

    def _refuse(self, why: str) -> NoReturn:
        raise ConfigError(
            f"the archive directory {self.root} {why}: set KEYLANE_ARCHIVE_DIR to a folder "
            "keylane can write in"
        )

    def write_pending(self, table: str, day: str, rows: Iterable[ArchiveRow]) -> Path:
        """Write ``rows`` to a new complete file of ``table`` for ``day``, durably (the
        data, then the name), and return it, still pending."""
        folder = self.root / table / day
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.strftime('%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        path = folder / f"{name}{PENDING}"
        _write(path, rows, lambda: self.faults.hit("prune.before_rename", table))
        return path

    def settle(self, path: Path, kept: list[ArchiveRow], written: int) -> Path | None:
        """Make the pending file ``path`` (of ``written`` rows) final, holding only
        ``kept``: the rows now gone from the table. None when no row is left in it."""
        if not kept:
            path.unlink()
            _sync_folder(path.parent)
            return None
        if len(kept) < written:
            _write(path, kept)  # the rows that stayed in the table leave the file first
        final = path.with_name(path.name.removesuffix(PENDING) + SETTLED)
        os.replace(path, final)
        _sync_folder(path.parent)
        return final

    def pending(self) -> list[tuple[str, Path]]:
        """Every pending file, with its table: what an interrupted run left to settle."""
        return [
            (table, path)
            for table in TABLES
            for path in sorted((self.root / table).glob(f"*/*{PENDING}"))
        ]

    def remove_temporaries(self) -> int:
        """Delete the files an interrupted run was still writing; how many."""
        removed = 0
        for table in TABLES:
            for path in (self.root / table).glob("*/.*.tmp"):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def days(self, table: str) -> list[str]:
        """The days ``table`` has files for, newest first."""
        folder = self.root / table
        if not folder.is_dir():
            return []
        return sorted((p.name for p in folder.iterdir() if p.is_dir()), reverse=True)

    def files(self, table: str, day: str) -> list[Path]:
        """The files of ``table`` for ``day``, settled and pending."""
        folder = self.root / table / day
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.name.endswith((SETTLED, PENDING)))

    def search(
        self,
        table: str,
        field: str,
        value: str,
        days: Iterable[str] | None = None,
        on_file: Callable[[Path], None] | None = None,
    ) -> Iterator[tuple[Path, ArchiveRow]]:
        """Rows of ``table`` whose ``field`` is ``value``, with their file, newest day
        first (or in ``days``). Lines are matched as text before they are parsed."""
        needle = f'"{field}":{json.dumps(value, ensure_ascii=False)}'
        for day in self.days(table) if days is None else days:
            for path in self.files(table, day):
                if on_file is not None:
                    on_file(path)
                for row in _matching(path, needle):
                    if str(row.get(field)) == value:
                        yield path, row


def read_rows(path: Path) -> list[ArchiveRow]:
    """Every row of an archive file."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _matching(path: Path, needle: str) -> Iterator[ArchiveRow]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if needle in line:
                yield json.loads(line)


def _write(
    path: Path, rows: Iterable[ArchiveRow], before_rename: Callable[[], None] = lambda: None
) -> None:
    """Write ``path`` whole or not at all: a hidden temporary file, flushed to disk, then
    renamed over ``path`` (and the folder flushed, so the new name survives a crash)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    with tmp.open("wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
            for row in rows:
                gz.write(dump_json(row).encode() + b"\n")
        raw.flush()
        os.fsync(raw.fileno())
    before_rename()
    os.replace(tmp, path)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder cannot be opened on every platform (Windows)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
