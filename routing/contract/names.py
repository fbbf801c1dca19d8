"""What names in the sources file may look like: one rule each, used wherever that kind of
name is checked."""

import re

#: A ``[sources.X]`` or ``[destinations.X]`` table, or a task: lowercase, 1..64 chars.
TABLE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
#: An environment variable that holds a secret or a header's value.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: An HTTP header (RFC 9110 token characters).
HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def check_env_name(name: str | None, what: str = "") -> str | None:
    """``name`` if it can be an environment variable's (or None); ``ValueError`` if not."""
    if name is not None and not ENV_NAME.fullmatch(name):
        raise ValueError(f"{what}not an environment variable name: {name!r}")
    return name
