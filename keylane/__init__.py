"""keylane: webhook lanes with one owner per record, versioned writes, exactly-once effects.

This module is the public import for user code. The packages below it are keylane's own:

* ``keylane.routing`` — pure key -> shard -> queue functions, and ``keylane.routing.contract``,
  what the receiver and the lanes share (events, wire messages, settings, errors, sources);
* ``keylane.producers`` — the webhook receiver;
* ``keylane.workers`` — the lanes, ownership and stores;
* ``keylane.ops`` — the ``keylane`` command.
"""

from keylane.routing.contract.errors import (
    ChangeNotApplicable,
    ConfigError,
    FieldNotOwned,
    InvalidEvent,
    KeylaneError,
    VersionConflict,
)
from keylane.routing.contract.events import Change, Event

__version__ = "0.1.0"

__all__ = [
    "Change",
    "ChangeNotApplicable",
    "ConfigError",
    "Event",
    "FieldNotOwned",
    "InvalidEvent",
    "KeylaneError",
    "VersionConflict",
    "__version__",
]
