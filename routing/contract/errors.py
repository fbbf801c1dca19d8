"""keylane's one exception tree. Driver, Redis and Celery errors are mapped at the boundary.

::

    KeylaneError
    ├── ConfigError                 settings or a sources file that cannot work
    ├── InvalidEvent                a delivery answered 4xx
    │   (SignatureError is answered 401)
    ├── SignatureError
    ├── ChangeNotApplicable, FieldNotOwned       a change that cannot apply
    ├── StoreError
    │   ├── StoreUnavailable
    │   │   └── ResourceUnavailable (also a ResourceError)
    │   ├── VersionConflict
    │   │   └── RecordMerged        the record is a tombstone naming its survivor
    │   └── AlreadyApplied
    ├── ResourceError               a record that lives elsewhere (keylane.workers.resource)
    │   ├── WriteConflict, WriteOutcomeUnknown, ResourceRejected
    │   └── ResourceUnavailable
    ├── HandlerError                a source's handler
    │   ├── HandlerTimeout
    │   └── InvalidHandlerResult
    ├── NotOwner
    │   └── StaleFence
    ├── BrokerUnavailable
    ├── MalformedMessage            bytes in a shard queue that are not a keylane message
    └── InjectedFault               a test's fault point (KEYLANE_FAULTS)

The outcomes a task or destination returns or raises (``Done``, ``RetryLater``, ``Conflict``,
``GiveUp``) are not errors: they are in :mod:`keylane.workers.destinations`.
"""


class KeylaneError(Exception):
    """Base of every error keylane raises on purpose."""


class ConfigError(KeylaneError):
    """Settings or a sources file that cannot work; raised at start-up."""


class InvalidEvent(KeylaneError):
    """A delivery that is not a valid event (answered 4xx, changes nothing)."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ChangeNotApplicable(KeylaneError):
    """A change that cannot apply to the record as it is (e.g. increment of a text field)."""

    def __init__(self, field: str, op: str, detail: str) -> None:
        super().__init__(f"{op} on field {field!r}: {detail}")
        self.field = field
        self.op = op


class FieldNotOwned(KeylaneError):
    """A change to a field its source does not own."""

    def __init__(self, source: str, fields: list[str]) -> None:
        super().__init__(f"source {source!r} does not own field(s) {', '.join(sorted(fields))}")
        self.source = source
        self.fields = fields


class StoreError(KeylaneError):
    """A store operation failed."""


class StoreMissing(StoreError):
    """There is no keylane store where a command that only uses one looked (nothing was
    created there)."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or is busy; the operation may be retried as is."""


class VersionConflict(StoreError):
    """The record's revision is no longer the one read: someone wrote in between."""

    def __init__(self, record_key: str, expected: int, found: int) -> None:
        super().__init__(f"record {record_key!r}: expected revision {expected}, found {found}")
        self.record_key = record_key
        self.expected = expected
        self.found = found


class RecordMerged(VersionConflict):
    """The record is a tombstone: it was merged into ``survivor``, and is never written
    again (a lane that meets it reads again, and forwards the event to the survivor)."""

    def __init__(self, record_key: str, expected: int, found: int, survivor: str) -> None:
        super().__init__(record_key, expected, found)
        self.args = (f"record {record_key!r} was merged into {survivor!r}",)
        self.survivor = survivor


class AlreadyApplied(StoreError):
    """The event id is already in the journal: this delivery must have no effect."""

    def __init__(self, source: str, event_id: str, outcome: str) -> None:
        super().__init__(f"event {source}/{event_id} already {outcome}")
        self.source = source
        self.event_id = event_id
        self.outcome = outcome


class NotOwner(KeylaneError):
    """This worker does not (or no longer) own the shard: it must not write."""

    def __init__(self, shard: int, detail: str = "") -> None:
        super().__init__(f"not the owner of shard {shard}" + (f": {detail}" if detail else ""))
        self.shard = shard


class StaleFence(NotOwner):
    """The store has seen a newer fencing token for the shard than the one presented."""

    def __init__(self, shard: int, token: int, current: int) -> None:
        super().__init__(shard, f"fencing token {token} is older than {current}")
        self.token = token
        self.current = current


class LeaseLost(KeylaneError):
    """A scheduled run's lease expired or was taken (its scheduler paused or lost Redis):
    the run must stop; nothing it sends is accepted any more (fencing)."""

    def __init__(self, job: str, detail: str = "") -> None:
        super().__init__(f"job {job} lost its run's lease" + (f": {detail}" if detail else ""))
        self.job = job


class BrokerUnavailable(KeylaneError):
    """Redis cannot take or give messages right now."""


class SignatureError(KeylaneError):
    """A delivery whose signature does not verify (answered 401)."""


class MalformedMessage(KeylaneError, ValueError):
    """Bytes in a shard queue that are not a keylane task message."""


class InjectedFault(KeylaneError):
    """Raised by a ``raise`` fault (:mod:`keylane.routing.contract.faults`)."""


class HandlerError(KeylaneError):
    """A source's handler did not give a change."""


class HandlerTimeout(HandlerError):
    """The source's handler ran past ``handler_time_limit_ms``."""


class InvalidHandlerResult(HandlerError):
    """The source's handler returned something that is not a change."""


class ResourceError(KeylaneError):
    """A versioned resource (a record that lives elsewhere) did not do what was asked."""


class WriteConflict(ResourceError):
    """The record is no longer at the version read (or, for a create, exists already)."""


class WriteOutcomeUnknown(ResourceError):
    """The write was sent but its answer was lost: it may or may not have happened."""


class ResourceRejected(ResourceError):
    """The resource rejected the request for good (a 4xx, a constraint): not retried; a
    ``rejected`` dead letter, as an HTTP forward's 4xx is. ("Refused" is kept for an event
    whose conditions did not hold.)"""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: The name this error had before 0.2.0 (code that raises or catches it keeps working).
ResourceRefused = ResourceRejected


class ResourceUnavailable(ResourceError, StoreUnavailable):
    """The resource cannot be reached or asks to wait; nothing was written, so the event
    may be tried again later as it is."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
