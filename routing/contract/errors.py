"""keylane's one exception tree. Driver, Redis and Celery errors are mapped at the boundary."""


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


class BrokerUnavailable(KeylaneError):
    """Redis cannot take or give messages right now."""


class SignatureError(KeylaneError):
    """A delivery whose signature does not verify (answered 401)."""
