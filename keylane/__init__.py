"""keylane: webhook lanes with one owner per record, versioned writes, exactly-once effects.

This module is the public import for user code::

    import keylane

    @keylane.task(key="contact:{email}")
    def sync_contact(event: keylane.Event, ctx: keylane.Context) -> None:
        ...  # runs once per event, in order per contact, never two at once for one contact

    sync_contact.send({"email": "ada@example.com", "plan": "pro"}, event_id="order-17")

and ``keylane worker -A myapp.tasks`` runs the tasks. Scheduled jobs and repairs::

    @keylane.schedule(every="5m", owns=["email", "plan"])
    def pull_contacts(run: keylane.Run) -> None:
        ...  # run.change("contact:42", {"email": {"set": ...}}) for each changed contact

    @keylane.repair(cron="0 3 * * *", timezone="Europe/Paris", owns=["domain"])
    def fill_domain(record: keylane.Record) -> dict | None:
        ...  # the change that repairs the record, or None

run under ``keylane scheduler -A myapp.jobs`` (``keylane up`` starts one). The packages
below it are keylane's own:

* ``keylane.routing`` — pure key -> shard -> queue functions, and ``keylane.routing.contract``,
  what the receiver and the lanes share (events, wire messages, settings, errors, sources);
* ``keylane.producers`` — the webhook receiver and the Python producer;
* ``keylane.workers`` — the lanes, ownership, destinations and stores;
* ``keylane.ops`` — the ``keylane`` command.
"""

from __future__ import annotations

import os as _os
from importlib import import_module as _import_module
from typing import TYPE_CHECKING

# In a checkout, keylane/'s four folders are links to routing/, producers/, workers/ and
# ops/ at the top of the tree: load them from there, so tracebacks, debuggers (a breakpoint
# on workers/lanes.py:120) and coverage name each file where it is in the tree. An
# installed keylane has real folders and is left as it is.
if _os.path.islink(_os.path.join(__path__[0], "workers")):
    __path__.insert(0, _os.path.dirname(_os.path.realpath(_os.path.join(__path__[0], "workers"))))

if TYPE_CHECKING:  # the names as the type checker and editors see them
    from .api import (
        JobFunction,
        RepairCheck,
        Task,
        TaskFunction,
        change,
        configure,
        repair,
        resource,
        schedule,
        task,
    )
    from .producers.runs import (
        Run,
    )
    from .producers.sender import (
        Sent,
    )
    from .routing.contract.errors import (
        BrokerUnavailable,
        ChangeNotApplicable,
        ConfigError,
        FieldNotOwned,
        InvalidEvent,
        KeylaneError,
        LeaseLost,
        ResourceError,
        ResourceRefused,
        ResourceRejected,
        ResourceUnavailable,
        VersionConflict,
        WriteConflict,
        WriteOutcomeUnknown,
    )
    from .routing.contract.events import (
        Change,
        Event,
    )
    from .routing.contract.sources import (
        FieldOwnership,
    )
    from .workers.destinations import (
        Conflict,
        Context,
        Done,
        GiveUp,
        Outcome,
        Refuse,
        RetryLater,
    )
    from .workers.resource import (
        Review,
        Snapshot,
        VersionedResource,
        Written,
        apply_versioned,
    )
    from .workers.store_rows import (
        Record,
    )

#: Where each public name lives: it is imported from there when first used (PEP 562),
#: so ``import keylane`` (and the ``keylane`` command, which is under it) loads
#: nothing heavy until a name is asked for.
_HOMES: dict[str, tuple[str, ...]] = {
    ".api": (
        "JobFunction",
        "RepairCheck",
        "Task",
        "TaskFunction",
        "change",
        "configure",
        "repair",
        "resource",
        "schedule",
        "task",
    ),
    ".producers.runs": ("Run",),
    ".producers.sender": ("Sent",),
    ".routing.contract.errors": (
        "BrokerUnavailable",
        "ChangeNotApplicable",
        "ConfigError",
        "FieldNotOwned",
        "InvalidEvent",
        "KeylaneError",
        "LeaseLost",
        "ResourceError",
        "ResourceRefused",
        "ResourceRejected",
        "ResourceUnavailable",
        "VersionConflict",
        "WriteConflict",
        "WriteOutcomeUnknown",
    ),
    ".routing.contract.events": ("Change", "Event"),
    ".routing.contract.sources": ("FieldOwnership",),
    ".workers.destinations": (
        "Conflict",
        "Context",
        "Done",
        "GiveUp",
        "Outcome",
        "Refuse",
        "RetryLater",
    ),
    ".workers.resource": ("Review", "Snapshot", "VersionedResource", "Written", "apply_versioned"),
    ".workers.store_rows": ("Record",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "BrokerUnavailable",
    "Change",
    "ChangeNotApplicable",
    "ConfigError",
    "Conflict",
    "Context",
    "Done",
    "Event",
    "FieldNotOwned",
    "FieldOwnership",
    "GiveUp",
    "InvalidEvent",
    "JobFunction",
    "KeylaneError",
    "LeaseLost",
    "Outcome",
    "Record",
    "Refuse",
    "RepairCheck",
    "ResourceError",
    "ResourceRefused",
    "ResourceRejected",
    "ResourceUnavailable",
    "RetryLater",
    "Review",
    "Run",
    "Sent",
    "Snapshot",
    "Task",
    "TaskFunction",
    "VersionConflict",
    "VersionedResource",
    "WriteConflict",
    "WriteOutcomeUnknown",
    "Written",
    "__version__",
    "apply_versioned",
    "change",
    "configure",
    "repair",
    "resource",
    "schedule",
    "task",
]


if not TYPE_CHECKING:  # the type checker sees the names above, and flags any other

    def __getattr__(name: str) -> object:
        """A public name, imported from its home on first use and kept here after."""
        module = _HOME_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOME_OF})
