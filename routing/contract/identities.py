"""Identities, and the merge that makes two records one (ops/docs/identities.md).

A record has one key, and one lane. When senders name one entity differently (a form by
email, the CRM by phone), an event may say which other names its record goes by: its
**identities**, ``kind:value`` text written in one normal form per kind (a lower-cased
email, an E.164 phone number), so that two spellings of one address are one identity.
keylane keeps an index from identity to record, written in the lane with the record's
write. When an event's identity already names another record, the two are one entity and
keylane merges them: never by guesswork, only through identities a source declares (or a
person's choice in triage).

A merge is two events, each in the lane of the record it changes, so neither record is
ever written outside its own lane:

1. **close** (in the absorbed record's lane, after the events it accepted before): the
   fields of the two records are compared; when they differ, nothing is merged and a
   review row shows both sides; otherwise the absorbed record becomes a tombstone naming
   its survivor, in one transaction with the close's journal entry;
2. **absorb** (in the survivor's lane): the survivor takes the absorbed record's fields it
   lacks, and the identities that named the absorbed record now name it.

The records of a task are elsewhere (a CRM): keylane keeps a row of no fields per key of a
task that merges (its creation time, its tombstone), its close always agrees, and its
absorb is a call of the task's ``on_merge`` with both keys, which merges the records there.

From the close on, the absorbed record's lane forwards each later event to the survivor's
lane (one step at a time, so the events of one sender stay in their order).

A person may **undo** a merge (``keylane merges undo``), again through both lanes: the
absorbed record is **reopened** in its lane (live again, its fields as the close left
them, the pair kept apart for good), then the survivor **releases** it in its own: each
field its absorb took goes back to what the survivor held before (its own value, or
none), unless an event or an edit changed it since (then it stays, and the release says
so), and the identities that came with it name the reopened record again
(:class:`GiveBack`).

The survivor is the **older** record (created first; the lower key when both were created
in the same instant, or before records kept their creation time): an order every lane
computes alike, so two merges racing for one pair, or a chain of merges, converge on one
survivor, and a merge can never go both ways.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

#: How the value of an identity kind is written before it is compared: ``email`` (trimmed,
#: lower-cased, one ``@``), ``phone`` (E.164: ``+``, the country code and the number,
#: spaces, dots, dashes and brackets dropped, a leading ``00`` read as ``+``), ``lower``
#: (trimmed, lower-cased), ``exact`` (trimmed).
IdentityRule = Literal["email", "phone", "lower", "exact"]

#: The rule of a kind a source does not name: ``email`` and ``phone`` by their names.
DEFAULT_RULES: Mapping[str, IdentityRule] = {"email": "email", "phone": "phone"}

#: The most identities one event may name.
MAX_IDENTITIES = 16
#: The longest identity, kind and value together.
MAX_IDENTITY_CHARS = 320

#: The source of a merge's events in the journal (reserved: no sources file may use it).
MERGE_SOURCE = "keylane.merge"

#: An identity's kind: the part before its first ``:``.
IDENTITY_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")
_E164 = re.compile(r"\+[1-9][0-9]{6,14}")
_PHONE_NOISE = re.compile(r"[\s.\-()/]")


def normal_identity(raw: object, rules: Mapping[str, IdentityRule] | None = None) -> str | None:
    """``kind:value`` in its normal form, by ``rules`` (else :data:`DEFAULT_RULES`); None
    when the value is empty (a form without a phone names no phone). ``ValueError`` says
    what is wrong."""
    if not isinstance(raw, str):
        raise ValueError("an identity is text, kind:value (e.g. email:ann@example.com)")
    kind, sep, value = raw.partition(":")
    kind = kind.strip().lower()
    if not sep or not IDENTITY_KIND.fullmatch(kind):
        raise ValueError(f"identity {raw[:80]!r}: write it as kind:value, kind in [a-z0-9_]")
    value = value.strip()
    if not value:
        return None
    rule = (rules or {}).get(kind) or DEFAULT_RULES.get(kind, "exact")
    normal = f"{kind}:{_normal_value(value, rule, raw)}"
    if len(normal) > MAX_IDENTITY_CHARS:
        raise ValueError(f"identity {raw[:80]!r}: longer than {MAX_IDENTITY_CHARS} characters")
    return normal


def _normal_value(value: str, rule: IdentityRule, raw: str) -> str:
    if rule == "exact":
        return value
    if rule == "lower":
        return value.lower()
    if rule == "email":
        local, at, domain = value.lower().partition("@")
        if not at or not local or not domain or "@" in domain or " " in value:
            raise ValueError(f"identity {raw[:80]!r}: not an email address")
        return f"{local}@{domain}"
    phone = _PHONE_NOISE.sub("", value)
    if phone.startswith("00"):
        phone = "+" + phone[2:]
    if not _E164.fullmatch(phone):
        raise ValueError(
            f"identity {raw[:80]!r}: not an E.164 phone number (+, country code, number)"
        )
    return phone


def check_identities(
    raw: object, rules: Mapping[str, IdentityRule] | None = None
) -> tuple[str, ...]:
    """A list of identities in normal form, in order, each once, empty ones left out;
    ``ValueError`` names the first that is wrong."""
    if not isinstance(raw, list | tuple):
        raise ValueError("also must be a list of identities, kind:value")
    if len(raw) > MAX_IDENTITIES:
        raise ValueError(f"at most {MAX_IDENTITIES} identities per event")
    out: list[str] = []
    for item in raw:
        normal = normal_identity(item, rules)
        if normal is not None and normal not in out:
            out.append(normal)
    return tuple(out)


def same_value(name: str, a: object, b: object) -> bool:
    """Whether two records' values of field ``name`` are one value: equal, or two
    spellings of one identity when the field is named like a kind with a rule (``email``,
    ``phone``)."""
    if a == b:
        return True
    if name not in DEFAULT_RULES or not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return normal_identity(f"{name}:{a}") == normal_identity(f"{name}:{b}")
    except ValueError:
        return False


MergeStep = Literal["close", "absorb", "reopen", "release"]
#: A person's choice for a field whose values differ: the absorbed record's or the
#: survivor's.
Side = Literal["absorbed", "survivor"]


class GiveBack(BaseModel):
    """What a merge undone gives back on the survivor, as the absorb's journal entry says
    (``keylane merges undo`` reads it, from the archive too, and the reopen and the
    release carry it): each field the absorb took, and what the survivor held before."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The absorbed record's values the survivor took.
    took: dict[str, Any] = {}
    #: The survivor's own value of each of those it held before the absorb (one neither
    #: here nor in ``unknown`` it lacked).
    replaced: dict[str, Any] = {}
    #: Those whose value before nothing says (an absorb journaled before absorbs kept what
    #: they replaced, and no review row of the pair): left as they are.
    unknown: tuple[str, ...] = ()
    #: The identities that came with the absorbed record.
    identities: tuple[str, ...] = ()
    #: The survivor's revision the absorb wrote (a field a later entry wrote changed since).
    revision: int | None = None


class Merge(BaseModel):
    """A merge step, as an event carries it to the lane of the record it changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: MergeStep
    absorbed: str
    survivor: str
    #: Fields whose values differ, and the side a person chose for each (triage).
    take: dict[str, Side] | None = None
    #: The review row a person resolved, when this merge comes from triage.
    review_of: int | None = None
    #: The task whose records elsewhere the two keys name (None: keylane's own records):
    #: the absorb is its ``on_merge`` call, in the survivor's lane.
    destination: str | None = None
    #: A merge undone (reopen, release): what the survivor gives back (None: a step
    #: queued before steps carried it; the release reads the absorb's journal entry).
    gives_back: GiveBack | None = None


def merge_event_id(absorbed: str, survivor: str, step: MergeStep, review_of: int | None) -> str:
    """The event id of a merge step: the same for every proposal of one pair (so a pair
    is merged, or reviewed, once), and a new one for a person's resolution of a review."""
    pair = hashlib.sha256(f"{absorbed}\0{survivor}".encode()).hexdigest()[:32]
    tail = "" if review_of is None else f"-r{review_of}"
    return f"{step}-{pair}{tail}"


def review_of_step(event_id: str) -> int | None:
    """The review row a merge step's event id names (``...-r12``), if any: the inverse of
    :func:`merge_event_id`'s tail."""
    _, sep, row = event_id.rpartition("-r")
    return int(row) if sep and row.isdigit() else None


def survivor_first(a: tuple[str, float | None], b: tuple[str, float | None]) -> tuple[str, str]:
    """(survivor, absorbed) of two records given as (key, created at): the older survives;
    the lower key when their times are equal (or unknown, counted as 0)."""
    first, second = sorted((a, b), key=lambda r: (r[1] or 0.0, r[0]))
    return first[0], second[0]
