"""From a verified delivery to what keylane will enqueue: the sender's event id, the
record key, the event type and the change, as the source's definition says.

Event ids always come from the sender (a body field, a header, the signature scheme's id
header, or a hash of the body). A delivery without one gets a synthetic id that is unique
to this delivery, so a missing id can never make two different events look like one
(a "null" key must never match); the answer says so and a counter records it.
"""

from __future__ import annotations

import hashlib
import pkgutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..routing.contract.conditions import WireConditions
from ..routing.contract.errors import ConfigError, InvalidEvent
from ..routing.contract.events import (
    Envelope,
    check_event_id,
    check_record_key,
    read_conditions,
    wire_changes,
)
from ..routing.contract.identities import check_identities
from ..routing.contract.mapping import MISSING, Delivery, is_reference, render, resolve
from ..routing.contract.sources import Hook, SourceConfig
from .signatures import Verified

KEYLESS_PREFIX = "keyless:"


@dataclass(frozen=True)
class Intake:
    """A delivery ready to enqueue."""

    event_id: str
    key_missing: bool
    event_type: str
    record_key: str
    changes: dict[str, dict[str, Any]]  # checked, in their wire form (``wire_changes``)
    conditions: WireConditions | None = None  # checked (``check_conditions``)
    if_revision: int | None = None
    identities: tuple[str, ...] = ()  # in their normal form (``check_identities``)


@dataclass(frozen=True)
class Ignored:
    """A verified delivery the source's mapping has nothing to apply for."""

    event_type: str
    reason: str


def take_in(
    source: SourceConfig,
    verified: Verified,
    body: bytes,
    payload: Any,
    headers: Mapping[str, str],
    hook: Hook | None = None,
) -> Intake | Ignored:
    """Read the event out of a delivery; :class:`InvalidEvent` (400) when it cannot be."""
    delivery = Delivery(payload, headers)
    event_id, key_missing = _event_id(source, verified, body, delivery)
    if source.forwards:
        return _forwarded(source, delivery, event_id, key_missing, hook)
    if source.format == "keylane":
        intake = _keylane(payload, event_id, key_missing)
        if intake.identities and source.records_in is not None:
            raise InvalidEvent("also: identities and merges apply to keylane's own records")
        return intake
    event_type = (render(source.event_type, delivery) if source.event_type else None) or "event"
    if hook is not None:
        return _hooked(source, hook, payload, headers, event_id, key_missing, event_type)
    return _mapped(source, delivery, event_id, key_missing, event_type)


def _event_id(
    source: SourceConfig, verified: Verified, body: bytes, delivery: Delivery
) -> tuple[str, bool]:
    rule = source.event_id_rule
    if rule == "content-hash":
        return _content_hash(body), False
    found = verified.event_id if rule == "signature" else render(rule, delivery)
    if found is not None:
        try:
            return check_event_id(found), False
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
    if source.missing_id == "reject":
        raise InvalidEvent(f"no event id at {rule}", code="missing_event_id")
    if source.missing_id == "content-hash":
        return _content_hash(body), True
    return keyless_id(), True


def keyless_id() -> str:
    """A synthetic event id for an event its sender gave none: unique, so it can never
    match another event."""
    return f"{KEYLESS_PREFIX}{uuid.uuid4()}"


def _content_hash(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _keylane(payload: Any, event_id: str, key_missing: bool) -> Intake:
    try:
        envelope = Envelope.read(payload)
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None
    return Intake(
        event_id,
        key_missing,
        envelope.type,
        envelope.record_key,
        envelope.changes,
        envelope.conditions,
        envelope.if_revision,
        envelope.identities,
    )


def _mapped(
    source: SourceConfig, delivery: Delivery, event_id: str, key_missing: bool, event_type: str
) -> Intake | Ignored:
    rules = source.on.get(event_type) or source.on.get("*")
    if rules is None:
        return Ignored(event_type, f"source {source.name} maps no changes for {event_type!r}")
    assert source.record_key is not None
    record_key = _record_key(render(source.record_key, delivery), source.record_key)
    raw: dict[str, Any] = {}
    for field, rule in rules.items():
        value = resolve(rule.reference, delivery) if rule.reference else rule.value
        if value is not MISSING:
            raw[field] = {rule.op: value}
    if not raw:
        return Ignored(event_type, "none of the mapped fields is present in the delivery")
    conditions = _mapped_conditions(source, delivery, event_type)
    identities = _identities(source, [render(t, delivery) or "" for t in source.also])
    return Intake(
        event_id, key_missing, event_type, record_key, _changes(raw), conditions, None, identities
    )


def _identities(source: SourceConfig, rendered: list[str]) -> tuple[str, ...]:
    """The identities a delivery names, normalised by the source's rules (a template
    whose parts the delivery lacks names none); a malformed one is a 400."""
    try:
        return check_identities(
            [text for text in rendered if text.partition(":")[2]], source.normalise
        )
    except ValueError as exc:
        raise InvalidEvent(f"also: {exc}") from None


def _mapped_conditions(
    source: SourceConfig, delivery: Delivery, event_type: str
) -> WireConditions | None:
    """The source's conditions for ``event_type``, each reference read from the delivery
    (a reference the delivery lacks is a 400: a condition is never dropped silently)."""
    table = source.conditions.get(event_type) or source.conditions.get("*")
    if not table:
        return None
    raw: dict[str, dict[str, Any]] = {}
    for field, condition in table.items():
        raw[field] = {}
        for op, operand in condition.items():
            value = resolve(operand, delivery) if is_reference(operand) else operand
            if value is MISSING:
                raise InvalidEvent(f"conditions: field {field!r}: {op}: nothing at {operand}")
            raw[field][op] = value
    return _conditions({"conditions": raw})[0]


def _hooked(
    source: SourceConfig,
    hook: Hook,
    payload: Any,
    headers: Mapping[str, str],
    event_id: str,
    key_missing: bool,
    event_type: str,
) -> Intake | Ignored:
    result = _call_hook(hook, payload, headers)
    if result is None:
        return Ignored(event_type, "the source's hook maps nothing for this delivery")
    record_key = _record_key(result.get("record_key"), "the hook's record_key")
    event_type = str(result.get("event_type") or event_type)
    conditions, if_revision = _conditions(result)
    changes = _changes(result.get("changes"))
    identities = _identities(source, _hook_also(result))
    return Intake(
        event_id, key_missing, event_type, record_key, changes, conditions, if_revision, identities
    )


def _forwarded(
    source: SourceConfig, delivery: Delivery, event_id: str, key_missing: bool, hook: Hook | None
) -> Intake | Ignored:
    """A delivery for a task or destination: the body is the payload, keylane only needs
    its record key (from the source's template, or from its hook)."""
    event_type = (render(source.event_type, delivery) if source.event_type else None) or "event"
    if hook is None:
        assert source.record_key is not None
        record_key = _record_key(render(source.record_key, delivery), source.record_key)
        also = [render(t, delivery) or "" for t in source.also]
    else:
        mapped = _call_hook(hook, delivery.body, delivery.headers)
        if mapped is None:
            return Ignored(event_type, "the source's hook maps nothing for this delivery")
        record_key = _record_key(mapped.get("record_key"), "the hook's record_key")
        also = _hook_also(mapped)
    identities = _identities(source, also)
    if identities and source.task is None:  # a hook's: a destination's records are not merged
        raise InvalidEvent("also: identities apply to keylane's own records and to tasks")
    return Intake(event_id, key_missing, event_type, record_key, {}, identities=identities)


def _hook_also(mapped: Mapping[str, Any]) -> list[Any]:
    also = mapped.get("also") or []
    if not isinstance(also, list):
        raise InvalidEvent("the source's hook returned also that is not a list of identities")
    return also


def _call_hook(hook: Hook, payload: Any, headers: Mapping[str, str]) -> Mapping[str, Any] | None:
    try:
        result = hook(payload, headers)
    except (ValueError, KeyError, TypeError, LookupError) as exc:
        raise InvalidEvent(f"the source's hook could not map this delivery: {exc}") from None
    if result is not None and not isinstance(result, Mapping):
        raise InvalidEvent("the source's hook returned neither a mapping nor None")
    return result


def _record_key(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidEvent(f"no record key at {where}", code="missing_record_key")
    try:
        return check_record_key(value)
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None


def _changes(raw: object) -> dict[str, dict[str, Any]]:
    try:
        return wire_changes(raw)
    except ValueError as exc:
        raise InvalidEvent(f"changes: {exc}") from None


def _conditions(raw: Mapping[str, Any]) -> tuple[WireConditions | None, int | None]:
    try:
        return read_conditions(dict(raw))
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None


def load_hook(source: SourceConfig) -> Hook | None:
    """The source's mapping hook (``hook = "module:function"``), imported from the user's
    code; ``ConfigError`` says why it cannot be."""
    if source.hook is None:
        return None
    try:
        hook = pkgutil.resolve_name(source.hook)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"source {source.name}: cannot load hook {source.hook}: {exc}") from exc
    if not callable(hook):
        raise ConfigError(f"source {source.name}: hook {source.hook} is not callable")
    return cast("Hook", hook)
