"""Versioned resources: where a record lives outside keylane, behind one interface
(:class:`keylane.workers.resource.VersionedResource`), one file per kind:

* :mod:`~keylane.workers.resources.etag` — HTTP with ETags (``If-Match``, ``If-None-Match``);
* :mod:`~keylane.workers.resources.pg_table` — the user's own PostgreSQL table;
* :mod:`~keylane.workers.resources.stamped` — HTTP without versions (a last-edited stamp,
  or the fields' values, compared right before the write).

:mod:`~keylane.workers.resources.http` is the one module that imports httpx, and
``pg_table`` the one that imports psycopg.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ...routing.contract.resources import (
    EtagResourceConfig,
    PgTableResourceConfig,
    ResourceConfig,
)
from ...routing.contract.sources import ALL_FIELDS, FieldOwnership
from ..resource import VersionedResource


def open_resource(
    config: ResourceConfig,
    environ: Mapping[str, str] | None = None,
    compare: FieldOwnership = ALL_FIELDS,
) -> VersionedResource:
    """The resource ``config`` describes, ready to use; ``ConfigError`` says what cannot
    work (a missing environment variable, a table without the columns it names).
    ``compare``: the fields a stamped resource compares when it has no stamp (the
    source's owned fields)."""
    env = os.environ if environ is None else environ
    if isinstance(config, EtagResourceConfig):
        from .etag import EtagResource

        return EtagResource(config, env)
    if isinstance(config, PgTableResourceConfig):
        from .pg_table import PgTableResource

        return PgTableResource(config, env)
    from .stamped import StampedResource

    return StampedResource(config, env, compare)
