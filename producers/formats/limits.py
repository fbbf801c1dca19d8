"""The limits every body format shares, and the errors that name them."""

from __future__ import annotations

from ...routing.contract.errors import InvalidEvent

#: The deepest a body's tree may nest, whatever its format (JSON, form keys, XML).
MAX_DEPTH = 32
#: The most fields a form or multipart body may carry.
MAX_FIELDS = 1000
#: The largest text field of a multipart body (a file part is only hashed, within the
#: body's own limit): a quarter of the default body limit.
MAX_FIELD_BYTES = 256 << 10


def too_deep(what: str) -> InvalidEvent:
    """400 ``too_deep``: ``what`` nests deeper than :data:`MAX_DEPTH`."""
    return InvalidEvent(f"{what} nested deeper than {MAX_DEPTH} levels", code="too_deep")
