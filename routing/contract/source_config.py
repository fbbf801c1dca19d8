"""One sender's table in the sources file, read and checked (:mod:`.sources` lists its keys)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .conditions import check_condition
from .destinations import check_task_name, task_destination
from .events import check_field_name
from .field_rules import FieldOwnership, FieldRule
from .identities import IDENTITY_KIND, MAX_IDENTITIES, MERGE_SOURCE, IdentityRule
from .mapping import check_items, check_template, is_reference
from .names import TABLE_NAME, check_env_name
from .presets import Handshake, Preset, Reply, preset_named
from .settings import MAX_BATCH, Settings
from .signing import HmacConfig, NoneConfig, VerifyConfig
from .source_defaults import carries_id, default_event_id, scheme_name

BodyFormat = Literal["auto", "json", "form", "multipart", "xml"]

#: Receiver-side mapping hook: (parsed body, headers) -> {"record_key", "changes"} or None.
Hook = Callable[[Any, Mapping[str, str]], "Mapping[str, Any] | None"]


class SourceConfig(BaseModel):
    """One sender."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    verify: VerifyConfig = Field(default_factory=NoneConfig)
    format: Literal["keylane", "mapped"] = "keylane"
    event_id: str | None = None  # None: where the scheme carries it (see event_id_rule)
    # (unset: the preset's, else "unique"; see missing_id_rule)
    missing_id: Literal["unique", "content-hash", "reject"] = "unique"
    # (unset: the preset's, else body:type; see event_type_rule)
    event_type: str | None = "body:type"
    body: BodyFormat | None = None  # None: the preset's, else "auto" (by media type)
    json_fields: tuple[str, ...] | None = None  # None: the preset's
    items: str | None = None  # None: the preset's (a batched sender's), else one event
    digest_excludes: tuple[str, ...] | None = None  # None: the preset's
    public_url: str | None = None
    #: The most of the global high-water mark this source's waiting events may take
    #: while another source's events wait too: past it a delivery is answered 429 (fair
    #: admission, ops/docs/production.md). 1.0: only the global mark holds it.
    backlog_share: float = Field(0.5, gt=0, le=1)
    record_key: str | None = None
    on: dict[str, dict[str, FieldRule]] = Field(default_factory=dict)
    hook: str | None = None
    handler: str | None = None
    batch_handler: str | None = None
    batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    task: str | None = None
    destination: str | None = None
    records_in: str | None = None
    owns: tuple[str, ...] = ("*",)
    #: Which of its deliveries are kept (None: ``KEYLANE_KEEP_DELIVERIES``): ``off``,
    #: ``errors`` (refused at the door, or an event refused or dead-lettered), ``all``.
    keep_deliveries: Literal["off", "errors", "all"] | None = None
    retention_s: int | None = Field(None, ge=1)
    journal_retention_s: int | None = Field(None, ge=1)
    on_dead_letter: Literal["continue", "hold"] = "continue"
    #: Conditions per event type, as ``on`` maps changes: field -> {operator: operand},
    #: an operand a literal or a ``body:``/``header:`` reference (:mod:`.conditions`).
    conditions: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)
    #: What a refusal (a condition unmet, a task's ``keylane.Refuse``) leaves besides its
    #: journal entry: nothing more (``"answer"``), or a review row (``"review"``).
    on_refusal: Literal["answer", "review"] = "answer"
    #: The environment variable holding this source's own outcomes token (read at the
    #: receiver's start-up): it reads this source's outcomes only (ops/docs/outcomes.md).
    outcomes_token_env: str | None = None
    #: The record's other identities, ``kind:{body:...}`` templates (:mod:`.identities`);
    #: one whose parts the delivery lacks is left out. For keylane's own records, or a task
    #: registered with ``on_merge``.
    also: tuple[str, ...] = ()
    #: How each identity kind is normalised (a kind not named: ``email`` and ``phone`` by
    #: their names, any other exactly as sent).
    normalise: dict[str, IdentityRule] = Field(default_factory=dict)

    @field_validator("also")
    @classmethod
    def _check_also(cls, templates: tuple[str, ...]) -> tuple[str, ...]:
        if len(templates) > MAX_IDENTITIES:
            raise ValueError(f"also: at most {MAX_IDENTITIES} identities")
        for template in templates:
            kind, sep, value = template.partition(":")
            if not sep or not IDENTITY_KIND.fullmatch(kind):
                raise ValueError(f"also: {template!r}: write kind:{{body:...}}")
            check_template(value)
        return templates

    @field_validator("outcomes_token_env")
    @classmethod
    def _check_outcomes_token_env(cls, name: str | None) -> str | None:
        return check_env_name(name, "outcomes_token_env: ")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not TABLE_NAME.fullmatch(name):
            raise ValueError(f"source names are lowercase [a-z0-9_.-], 1..64 chars: {name!r}")
        if name == MERGE_SOURCE:
            raise ValueError(f"the source name {name!r} is keylane's own (its merges)")
        return name

    @field_validator("event_id")
    @classmethod
    def _check_event_id(cls, rule: str | None) -> str | None:
        if rule is None or rule in ("signature", "content-hash"):
            return rule
        return check_template(rule)

    @field_validator("event_type")
    @classmethod
    def _check_event_type(cls, rule: str | None) -> str | None:
        return rule if rule is None else check_template(rule)

    @field_validator("items")
    @classmethod
    def _check_items(cls, rule: str | None) -> str | None:
        return rule if rule is None else check_items(rule)

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            raise ValueError(f"public_url: not an http(s) URL: {url!r}")
        return url

    @field_validator("record_key")
    @classmethod
    def _check_record_key(cls, template: str | None) -> str | None:
        return template if template is None else check_template(template)

    @field_validator("on")
    @classmethod
    def _check_fields(cls, on: dict[str, dict[str, FieldRule]]) -> dict[str, dict[str, FieldRule]]:
        for rules in on.values():
            for field in rules:
                check_field_name(field)
        return on

    @field_validator("conditions")
    @classmethod
    def _check_conditions(
        cls, conditions: dict[str, dict[str, dict[str, Any]]]
    ) -> dict[str, dict[str, dict[str, Any]]]:
        for by_field in conditions.values():
            for field, condition in by_field.items():
                check_field_name(field)
                literal = {
                    op: value for op, value in dict(condition).items() if not is_reference(value)
                }
                check_condition(field, literal or {"present": True})
        return conditions

    @field_validator("hook", "handler", "batch_handler")
    @classmethod
    def _check_hook(cls, hook: str | None) -> str | None:
        if hook is not None and not re.fullmatch(r"[\w.]+:\w+", hook):
            raise ValueError(f"hooks are 'package.module:function', got {hook!r}")
        return hook

    @field_validator("task")
    @classmethod
    def _check_task(cls, task: str | None) -> str | None:
        return task if task is None else check_task_name(task)

    @model_validator(mode="after")
    def _check_format(self) -> SourceConfig:
        if self.forwards:
            return self._check_forward()
        if self.records_in is not None and (self.handler or self.batch_handler):
            raise ValueError("handler applies to keylane's own records, not to records_in")
        if self.handler is not None and self.batch_handler is not None:
            raise ValueError("a source has a handler or a batch_handler, not both")
        if self.records_in is not None and (self.batch or 1) > 1:
            raise ValueError("batch applies to sources that change keylane's own records")
        if self.records_in is not None and self.also:
            raise ValueError("also (identities, merges) applies to keylane's own records")
        unmapped = self.record_key is None or not self.on
        if self.format == "mapped" and self.hook is None and unmapped:
            raise ValueError("a mapped source needs record_key and an `on` table, or a hook")
        if self.format == "keylane" and (self.on or self.hook or self.record_key or self.also):
            raise ValueError('record_key, on, hook and also apply to format = "mapped" only')
        if self.conditions and (self.format != "mapped" or self.hook is not None):
            raise ValueError('a conditions table applies to format = "mapped" with an `on` table')
        if self.event_id_rule == "signature" and not carries_id(self.verify):
            scheme = scheme_name(self.verify)
            raise ValueError(f'event_id = "signature": scheme {scheme!r} has no id header')
        return self

    def _check_forward(self) -> SourceConfig:
        if self.task is not None and self.destination is not None:
            raise ValueError("a source names a task or a destination, not both")
        if self.also and self.task is None:
            raise ValueError(
                "also (identities, merges) applies to keylane's own records and to tasks "
                "(whose on_merge merges the records where they are), not to a destination"
            )
        if self.records_in is not None:
            raise ValueError("a source forwards (task, destination) or has records_in, not both")
        if self.on or self.handler or self.batch_handler:
            raise ValueError("on and handler apply to sources that change keylane's records")
        if self.destination is not None and (self.batch or 1) > 1:
            raise ValueError(
                "batch applies to sources that change keylane's records or name a task"
            )
        if self.record_key is None and self.hook is None:
            raise ValueError("a source with a task or destination needs record_key (or a hook)")
        return self

    @cached_property
    def forwards(self) -> bool:
        """Whether its events go to a task or destination (not to keylane's records)."""
        return self.task is not None or self.destination is not None

    @cached_property
    def destination_name(self) -> str | None:
        """The destination its events go to, if any (None: keylane's own records)."""
        if self.task is not None:
            return task_destination(self.task).name
        return self.destination or self.records_in

    @cached_property
    def ownership(self) -> FieldOwnership:
        """The fields this source may write."""
        return FieldOwnership.of(self.owns)

    @cached_property
    def unsigned(self) -> bool:
        """Whether deliveries are accepted without a signature."""
        return isinstance(self.verify, NoneConfig)

    # What a source says (its own settings, else its preset's) is read on every delivery,
    # several times: each is worked out once (the model is frozen).
    @cached_property
    def preset(self) -> Preset | None:
        """The sender preset its scheme names (None: ``hmac`` or ``none``)."""
        return preset_named(scheme_name(self.verify))

    @cached_property
    def event_id_rule(self) -> str:
        """Where its deliveries' event ids live: ``event_id``, or by default where its
        signature scheme carries them (:func:`default_event_id`)."""
        return self.event_id or default_event_id(self.verify)

    @cached_property
    def missing_id_rule(self) -> str:
        """What a delivery without an event id gets: ``missing_id``, else the preset's."""
        if "missing_id" in self.model_fields_set or self.preset is None:
            return self.missing_id
        return self.preset.missing_id

    @cached_property
    def event_type_rule(self) -> str | None:
        """Where its event type is read (None: every event is of type ``event``):
        ``event_type`` as set, else the preset's, else ``body:type``."""
        if "event_type" in self.model_fields_set or self.preset is None:
            return self.event_type
        return self.preset.event_type

    @cached_property
    def body_format(self) -> str:
        """The format its bodies are read in (``auto``: by media type)."""
        return self.body or (self.preset.body if self.preset else "auto")

    @cached_property
    def json_field_paths(self) -> tuple[str, ...]:
        """The fields of its bodies whose text is JSON."""
        if self.json_fields is not None or self.preset is None:
            return self.json_fields or ()
        return self.preset.json_fields

    @cached_property
    def items_rule(self) -> str | None:
        """Where the events of a batched delivery are (None: a delivery is one event)."""
        return self.items or (self.preset.items if self.preset else None)

    @cached_property
    def digest_exclusions(self) -> tuple[str, ...]:
        """The fields left out of the digest that tells a retry from a reused id."""
        if self.digest_excludes is not None or self.preset is None:
            return self.digest_excludes or ()
        return self.preset.digest_excludes

    @cached_property
    def handshake(self) -> Handshake | None:
        """The handshake the receiver answers for it, if any."""
        return self.preset.handshake if self.preset else None

    @cached_property
    def signs_url(self) -> bool:
        """Whether its sender signs the URL it calls (``KEYLANE_PUBLIC_URL`` is needed)."""
        if isinstance(self.verify, HmacConfig):
            return "{url}" in self.verify.signed_payload
        return self.preset is not None and self.preset.signs_url

    @cached_property
    def reply(self) -> Reply | None:
        """The body its sender expects in a 2xx instead of keylane's JSON, if any."""
        return self.preset.reply if self.preset else None

    def start_up_warnings(self, built_in: bool = False) -> list[str]:
        """What an operator should hear about this source when keylane starts: it takes
        unsigned deliveries (``built_in``: the ``demo`` source that exists when there is no
        sources file), or its deliveries may all be keyless (never deduplicated: a retry
        runs again) because nothing says where their id lives."""
        warnings = []
        if self.unsigned and built_in:
            warnings.append(
                f"source {self.name} accepts UNSIGNED deliveries from anyone who can reach the "
                "receiver (no sources file: KEYLANE_SOURCES_FILE is unset); declare your "
                "senders and their signatures in a sources file before exposing the receiver"
            )
        elif self.unsigned:
            warnings.append(
                f"source {self.name} accepts UNSIGNED deliveries (verify.scheme = none)"
            )
        if self.keyless_by_default:
            warnings.append(
                f"source {self.name} has no event_id and its signature scheme carries no id: "
                'deliveries without a top-level "id" are KEYLESS, so a sender\'s retry is '
                "applied again; set event_id (body:<path>, header:<name>) or missing_id"
            )
        return warnings

    @cached_property
    def keyless_by_default(self) -> bool:
        """Whether its event id is the fallback ``body:id`` in a body that is not keylane's
        envelope, from a scheme with no id of its own: nothing says where the sender's id
        lives, so every delivery may be keyless."""
        if self.event_id is not None or self.missing_id_rule != "unique":
            return False
        if self.format == "keylane" and not self.forwards:
            return False  # keylane's envelope has its "id"
        return self.event_id_rule == "body:id" and scheme_name(self.verify) != "stripe"

    def batch_limit(self, settings: Settings) -> int:
        """How many waiting events of one record a lane may take together (1: never
        batched): sources that change keylane's own records (default ``batch_max``) and
        sources that name a batch task (their ``batch``, default 1)."""
        if self.task is not None:
            return self.batch or 1
        if self.forwards or self.records_in is not None:
            return 1
        return self.batch if self.batch is not None else settings.batch_max

    def delivery_window(self, settings: Settings) -> str:
        """Which of its deliveries are kept: its ``keep_deliveries``, else the settings'."""
        return self.keep_deliveries or settings.keep_deliveries

    def retention(self, settings: Settings) -> int:
        """Seconds a delivered event id is remembered in Redis: ``retention_s``, else its
        preset's (the provider's longest retry window, with margin), else the settings'."""
        if self.retention_s is not None:
            return self.retention_s
        preset = self.preset
        return preset.retention_s if preset is not None else settings.dedupe_retention_s

    def journal_retention(self, settings: Settings) -> int:
        """Seconds the store's journal keeps this source's rows in its table before they
        are archived: its own ``journal_retention_s``, else ``journal_retention_s`` of the
        settings, but never less than its dedupe retention plus ``journal_margin_s``, so
        the journal still holds every id the sender may retry and Redis may forget."""
        floor = self.retention(settings) + settings.journal_margin_s
        wanted = self.journal_retention_s or settings.journal_retention_s or 0
        return max(wanted, floor)


DEMO = SourceConfig(name="demo")
