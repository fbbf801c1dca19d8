"""Source definitions: who may send, how to read their deliveries, which fields they own.

With no sources file, one source exists: ``demo``, unsigned, taking keylane's own envelope
and owning every field. A sources file (``KEYLANE_SOURCES_FILE``, TOML) replaces it; see
the docs page "Sources and signatures" (ops/docs/sources.md) for a complete example. Per source:

* ``verify``: the signature scheme and the environment variables holding its secrets;
* ``format``: ``keylane`` (the envelope) or ``mapped`` (``record_key`` template plus a
  declarative ``on`` table of changes per event type, or a ``hook = "module:function"``);
* ``event_id``: where the sender's id lives (a reference or template: ``body:<path>``,
  ``header:<name>``, ``{body:a}:{body:b}``; ``signature`` for the scheme's id header, or
  ``content-hash``); by default where the sender preset puts it (:mod:`.presets`:
  ``webhook-id``, ``X-GitHub-Delivery``, Stripe's body ``id``, HubSpot's portal,
  subscription and event ids, ...) or an ``hmac`` source's ``event_id_header``, else
  ``body:id``; and ``missing_id``: what to do when a delivery has none (``unique``: a
  synthetic id that can never match another; ``content-hash``; ``reject``);
* ``body``: the format of its bodies (``auto``: by media type; ``json``, ``form``,
  ``multipart``, ``xml``), ``json_fields``: fields whose text is JSON, read in place;
* ``items``: where the events of a batched delivery are (``body:*``,
  ``body:entry.*.changes.*``): each becomes an event, all accepted in one step;
  ``digest_excludes``: fields a sender changes when it retries (left out of the digest
  that tells a retry from an id reused with another body);
* ``public_url``: the URL the sender calls, for schemes that sign it (Twilio, HubSpot;
  default ``KEYLANE_PUBLIC_URL`` followed by the request's path);
* ``backlog_share``: the most of the global high-water mark its waiting events may take
  while other sources' events wait (default 0.5): one sender's flood is slowed (429) while
  the others are still accepted;
* ``handler``: an optional ``module:function`` the lane calls on every attempt with the
  event and the record as freshly read, returning the change to apply;
  ``batch_handler`` instead: called once per attempt with a record's waiting events (a
  list, in order) and the record, returning one change (or None) per event;
* ``batch``: how many waiting events of one record a lane applies with one read and one
  write (default ``batch_max`` for sources that change keylane's own records), or, for a
  source that names a batch task, hands to one call of it (default 1);
* ``task`` / ``destination``: instead of a change to keylane's records, each event goes
  to a registered user task or to a ``[destinations.<name>]`` (see
  :mod:`keylane.routing.contract.destinations`), with the body as its payload and the
  record key from ``record_key`` (or a hook);
* ``records_in``: the records live elsewhere — a version-checked ``[destinations.<name>]``
  (``etag``, ``pg_table``, ``stamped``): its events are changes as above, written where
  the record lives with a fresh read and a version check;
* ``owns``: the fields it may write; ``retention_s``: how long ids are remembered
  (default: the provider's longest retry window); ``journal_retention_s``: how long its
  journal rows stay in the store's table (never less than ``retention_s`` plus the
  journal margin); ``on_dead_letter``: ``continue`` or
  ``hold`` (later events of the key wait until the review row is closed);
  ``outcomes_token_env``: the environment variable holding a bearer token that reads this
  source's told outcomes (``GET /outcomes/<source>/...``, beside the global
  ``KEYLANE_OUTCOMES_TOKEN``), named as signing secrets are, never written in the file.

The file may also declare scheduled jobs (``[schedules.<name>]``) and repairs
(``[repairs.<name>]``), see :mod:`keylane.routing.contract.schedules`; each job or repair
whose events change keylane's records is a source of its own, named after it
(:meth:`Sources.with_jobs`), which the lanes know and the receiver does not.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .destinations import DestinationConfig, task_destination
from .errors import ConfigError
from .field_rules import ALL_FIELDS, FieldOwnership, FieldRule
from .schedules import JobSpec, RepairConfig, ScheduleConfig
from .settings import Settings
from .source_config import DEMO, BodyFormat, Hook, SourceConfig
from .source_defaults import default_event_id

# The names a source's users import from here, whichever module holds them.
__all__ = [
    "ALL_FIELDS",
    "DEMO",
    "BodyFormat",
    "FieldOwnership",
    "FieldRule",
    "Hook",
    "SourceConfig",
    "Sources",
    "default_event_id",
    "load_sources",
    "parse_sources",
]


class Sources:
    """The configured sources (and destinations), by name."""

    def __init__(
        self,
        sources: list[SourceConfig],
        destinations: list[DestinationConfig] | None = None,
        jobs: list[ScheduleConfig | RepairConfig] | None = None,
    ) -> None:
        self._by_name = {s.name: s for s in sources}
        implied = [task_destination(s.task) for s in sources if s.task is not None]
        self.destinations = {d.name: d for d in [*implied, *(destinations or [])]}
        self.jobs = list(jobs or [])  # [schedules.X] and [repairs.X], functions not imported
        for source in sources:
            self._check_destination(source)

    def with_jobs(self, jobs: list[JobSpec], repair_handler: str) -> Sources:
        """These sources and one more per scheduled job or repair whose events change
        keylane's records (named after it, owning its ``owns``; a repair's has the handler
        ``repair_handler``, which calls its check again on the lane's fresh read:
        ``keylane.workers.jobs.RECHECK_HANDLER``): what the lanes look events up in. A job
        that names a configured ``source`` must find it."""
        implied = []
        for job in jobs:
            if job.source is not None:
                if job.source not in self._by_name:
                    raise ConfigError(f"job {job.name}: no [sources.{job.source}] table")
                continue
            if not job.owns:
                continue
            if job.name in self._by_name:
                raise ConfigError(f"job {job.name}: a source has the same name; rename one")
            handler = repair_handler if job.kind == "repair" else None
            implied.append(SourceConfig(name=job.name, owns=job.owns, handler=handler))
        return Sources(self.all() + implied, list(self.destinations.values()), self.jobs)

    def _check_destination(self, source: SourceConfig) -> None:
        name = source.destination or source.records_in
        if name is None:
            return
        found = self.destinations.get(name)
        if found is None:
            raise ConfigError(f"source {source.name}: no [destinations.{name}] table")
        if source.records_in is not None and not found.versioned:
            raise ConfigError(
                f"source {source.name}: records_in names {name}, which holds no records "
                f"(kind {found.kind}); use destination = {name!r} to forward to it"
            )
        if source.destination is not None and found.versioned:
            raise ConfigError(
                f"source {source.name}: {name} holds records (kind {found.kind}); "
                f"name it with records_in = {name!r}"
            )

    def get(self, name: str) -> SourceConfig | None:
        """The source called ``name``, if configured."""
        return self._by_name.get(name)

    def field_owners(self) -> dict[str, frozenset[str]]:
        """Each field some source names in its ``owns`` -> those sources (a source that
        owns every field, ``*``, names none): whose value wins a merge where two records
        differ (:mod:`.identities`)."""
        owners: dict[str, set[str]] = {}
        for source in self.all():
            for name in source.ownership.fields:
                owners.setdefault(name, set()).add(source.name)
        return {name: frozenset(found) for name, found in owners.items()}

    def names(self) -> list[str]:
        """Every configured source name."""
        return sorted(self._by_name)

    def all(self) -> list[SourceConfig]:
        """Every source."""
        return [self._by_name[n] for n in self.names()]


def parse_sources(text: str, origin: str = "sources file") -> Sources:
    """Sources from TOML text with one ``[sources.<name>]`` table per source."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from exc
    tables = data.get("sources")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{origin}: no [sources.<name>] table")
    unknown = set(data) - {"sources", "destinations", "schedules", "repairs"}
    if unknown:
        raise ConfigError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    destinations = data.get("destinations", {})
    if not isinstance(destinations, dict):
        raise ConfigError(f"{origin}: destinations are [destinations.<name>] tables")
    jobs: list[ScheduleConfig | RepairConfig] = [
        *_tables(data.get("schedules", {}), ScheduleConfig, f"{origin}: schedule"),
        *_tables(data.get("repairs", {}), RepairConfig, f"{origin}: repair"),
    ]
    return Sources(
        _tables(tables, SourceConfig, f"{origin}: source"),
        _tables(destinations, DestinationConfig, f"{origin}: destination"),
        jobs,
    )


M = TypeVar("M", bound=BaseModel)


def _tables(tables: dict[str, Any], model: type[M], where: str) -> list[M]:
    """One ``model`` per ``[<kind>.<name>]`` table; ``ConfigError`` names a bad one."""
    found = []
    for name, table in tables.items():
        try:
            found.append(model(name=name, **table))
        except (ValidationError, TypeError) as exc:
            raise ConfigError(f"{where} {name!r}: {exc}") from exc
    return found


def load_sources(settings: Settings) -> Sources:
    """The sources of this deployment (the ``demo`` source when no file is configured)."""
    if settings.sources_file is None:
        return Sources([DEMO])
    path = Path(settings.sources_file)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read sources file {path}: {exc}") from exc
    return parse_sources(text, str(path))
