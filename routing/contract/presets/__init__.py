"""Sender presets: ``verify = {scheme = "<name>"}`` names a provider, and its source gets
that provider's signature check, event id, event type, retry window, batch layout,
handshake and answer by default (each overridable in the source's table).

One module per kind of sender, each entry written from the provider's documentation and
SDK (the sources are named in ops/docs/senders.md, where the table of every preset is).
"""

from __future__ import annotations

from .billing import BILLING
from .builders import BUILDERS
from .crm import CRM
from .forms import FORMS
from .generic import GENERIC
from .messaging import MESSAGING
from .model import Algorithm, Check, Encoding, Handshake, KeyForm, Preset, Reply, SignatureLayout
from .sales import SALES

__all__ = [
    "PRESETS",
    "Algorithm",
    "Check",
    "Encoding",
    "Handshake",
    "KeyForm",
    "Preset",
    "Reply",
    "SignatureLayout",
    "preset_named",
]

#: Every preset by its scheme name.
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (*GENERIC, *BILLING, *CRM, *FORMS, *MESSAGING, *SALES, *BUILDERS)
}


def preset_named(scheme: str) -> Preset | None:
    """The preset of ``scheme``, or None for ``hmac``/``none`` (nothing by default)."""
    return PRESETS.get(scheme)
