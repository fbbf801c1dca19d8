"""From a verified delivery to what keylane will enqueue: the sender's event id, the
record key, the event type and the change, as the source's definition says; for a
batched delivery (a source's ``items``), one of each per item.

Event ids always come from the sender (a body field, a header, the signature scheme's id
header, or a hash of the body or item). A delivery without one gets a synthetic id that
is unique to this delivery, so a missing id can never make two different events look like
one (a "null" key must never match); the answer says so and a counter records it.

Each event also carries its *digest*: what tells the sender's retry (the same digest) from
an id reused with another body. It is the SHA-256 of the body as it came, or, for an item,
a multipart body (whose boundary changes from one request to the next) or a source whose
sender changes fields when it retries (``digest_excludes``), of its tree's canonical JSON
without those fields.
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
from ..routing.contract.mapping import (
    MISSING,
    Delivery,
    is_reference,
    items_of,
    render,
    resolve,
)
from ..routing.contract.sources import Hook, SourceConfig
from ..routing.hot_records import hot_record
from .formats import canonical_json, digest_of
from .signatures import Verified

KEYLESS_PREFIX = "keyless:"


@dataclass(slots=True)
class Intake:
    """A delivery ready to enqueue (its ``digest`` and ``text`` filled in once it is read:
    not frozen, as a copy made to fill them cost a tenth of the receiver's read of it)."""

    event_id: str
    key_missing: bool
    event_type: str
    record_key: str
    changes: dict[str, dict[str, Any]]  # checked, in their wire form (``wire_changes``)
    conditions: WireConditions | None = None  # checked (``check_conditions``)
    if_revision: int | None = None
    identities: tuple[str, ...] = ()  # in their normal form (``check_identities``)
    #: What tells a retry from a reused id (the module docstring).
    digest: str = ""
    #: For a task or destination: the JSON text it gets (the body as it came, or an
    #: item's, or a body that was not JSON, as canonical JSON).
    text: str | None = None


@hot_record
class Ignored:
    """A verified delivery (or an item of one) the source's mapping has nothing to apply for."""

    event_type: str
    reason: str


@hot_record
class Parts:
    """What a delivery came with, besides its body's tree: the bytes as they came, the
    headers (lowercased names), the URL's query parameters and the body's format."""

    body: bytes
    headers: Mapping[str, str]
    query: Mapping[str, str]
    form: str = "json"


def take_in_all(
    source: SourceConfig,
    verified: Verified,
    parts: Parts,
    tree: Any,
    hook: Hook | None = None,
    max_items: int = 1000,
) -> list[Intake | Ignored]:
    """The events of a delivery: one, or (a source with ``items``) one per item, in the
    order they come; :class:`InvalidEvent` (a 4xx naming the item) when any of them
    cannot be read: a delivery is taken whole or not at all."""
    if source.items_rule is None:
        return [take_in(source, verified, parts.body, tree, parts.headers, hook, parts)]
    selected = items_of(source.items_rule, tree)
    if len(selected) > max_items:
        raise InvalidEvent(
            f"{len(selected)} items in one delivery, over the limit of {max_items}",
            status=413,
            code="too_many_items",
        )
    delivery = Delivery(tree, parts.headers, parts.query)
    taken: list[Intake | Ignored] = []
    for index, (item, at) in enumerate(selected):
        digest = digest_of(item, source.digest_exclusions)
        try:
            taken.append(
                _take(source, verified, delivery.item(item, at, index), digest, hook, _text(item))
            )
        except InvalidEvent as exc:
            raise replace_message(exc, f"item {index}: {exc}") from None
    return taken


def replace_message(error: InvalidEvent, message: str) -> InvalidEvent:
    """``error`` with another message (its status and code kept)."""
    return InvalidEvent(message, status=error.status, code=error.code)


def _text(tree: Any) -> str:
    return canonical_json(tree).decode()


def take_in(
    source: SourceConfig,
    verified: Verified,
    body: bytes,
    payload: Any,
    headers: Mapping[str, str],
    hook: Hook | None = None,
    parts: Parts | None = None,
) -> Intake | Ignored:
    """Read the one event out of a delivery (its ``payload``: the body's tree);
    :class:`InvalidEvent` (400) when it cannot be."""
    delivery = Delivery(payload, headers, parts.query if parts is not None else {})
    multipart = parts is not None and parts.form == "multipart"
    if source.digest_exclusions or multipart:
        # A multipart body's boundary is the sender's client's choice, new for each request
        # (a retry too): its fields are what it says.
        digest = digest_of(payload, source.digest_exclusions)
    else:
        digest = hashlib.sha256(body).hexdigest()
    text = None
    if source.forwards:
        json_body = parts is None or parts.form == "json"
        text = body.decode() if json_body else _text(payload)
    return _take(source, verified, delivery, digest, hook, text)


def _take(
    source: SourceConfig,
    verified: Verified,
    delivery: Delivery,
    digest: str,
    hook: Hook | None,
    text: str | None,
) -> Intake | Ignored:
    event_id, key_missing = _event_id(source, verified, digest, delivery)
    taken = _mapping(source, delivery, event_id, key_missing, hook)
    if isinstance(taken, Intake):
        taken.digest = digest
        taken.text = text if source.forwards else None
    return taken


def _mapping(
    source: SourceConfig,
    delivery: Delivery,
    event_id: str,
    key_missing: bool,
    hook: Hook | None,
) -> Intake | Ignored:
    if source.forwards:
        return _forwarded(source, delivery, event_id, key_missing, hook)
    if source.format == "keylane":
        intake = _keylane(delivery.body, event_id, key_missing)
        if intake.identities and source.records_in is not None:
            raise InvalidEvent("also: identities and merges apply to keylane's own records")
        return intake
    event_type = _event_type(source, delivery)
    if hook is not None:
        return _hooked(
            source, hook, delivery.body, delivery.headers, event_id, key_missing, event_type
        )
    return _mapped(source, delivery, event_id, key_missing, event_type)


def _event_type(source: SourceConfig, delivery: Delivery) -> str:
    rule = source.event_type_rule
    return (render(rule, delivery) if rule else None) or "event"


def _event_id(
    source: SourceConfig, verified: Verified, digest: str, delivery: Delivery
) -> tuple[str, bool]:
    rule = source.event_id_rule
    if rule == "content-hash":
        return _content_hash(digest), False
    found = verified.event_id if rule == "signature" else render(rule, delivery)
    if found is not None:
        try:
            return check_event_id(found), False
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
    missing = source.missing_id_rule
    if missing == "reject":
        raise InvalidEvent(f"no event id at {rule}", code="missing_event_id")
    if missing == "content-hash":
        return _content_hash(digest), True
    return keyless_id(), True


def keyless_id() -> str:
    """A synthetic event id for an event its sender gave none: unique, so it can never
    match another event."""
    return f"{KEYLESS_PREFIX}{uuid.uuid4()}"


def _content_hash(digest: str) -> str:
    return "sha256:" + digest


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
    event_type = _event_type(source, delivery)
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
