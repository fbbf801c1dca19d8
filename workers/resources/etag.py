"""HTTP resources with ETags: the version is the record's ETag.

* read: ``GET``; a strong ``ETag`` is required (a weak one cannot be used with ``If-Match``);
* update: ``PATCH`` with only the changed fields (``write = "patch"``), or ``PUT`` of the
  whole document as read with the change merged in (``write = "put"``), either with
  ``If-Match: <etag read>``; 412 means the record moved;
* create: ``PUT`` with ``If-None-Match: *``; 412 means someone created it first.

Either way a field the source does not own is sent only as it was read, under a version
check, so a person's concurrent edit of it is never overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...routing.contract.errors import ResourceRefused
from ...routing.contract.resources import EtagResourceConfig
from ..resource import Snapshot, Version
from .http import Answer, HttpRecords


class EtagResource:
    """A :class:`~keylane.workers.resource.VersionedResource` over HTTP with ETags."""

    def __init__(self, config: EtagResourceConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.http = HttpRecords(config, environ)

    def read(self, key: str) -> Snapshot:
        """``GET`` the record (absent on 404); its version is its ETag."""
        return self.http.read(key, lambda answer, _: _strong_etag(key, answer))

    def create(self, key: str, fields: Mapping[str, Any]) -> Version | None:
        """``PUT`` with ``If-None-Match: *``."""
        headers = {"If-None-Match": "*"}
        return self.http.send("PUT", key, self.http.wrapped(fields), headers, creating=True).etag

    def update(self, key: str, fields: Mapping[str, Any], read: Snapshot) -> Version | None:
        """``PATCH`` the changed fields, or ``PUT`` them merged onto the read document,
        with ``If-Match``."""
        headers = {"If-Match": str(read.version)}
        if self.config.write == "patch":
            body, method = self.http.wrapped(fields), "PATCH"
        else:
            body, method = self.http.merged(read.document, fields), "PUT"
        return self.http.send(method, key, body, headers, creating=False).etag

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


def _strong_etag(key: str, answer: Answer) -> str:
    if not answer.etag or answer.etag.startswith("W/"):
        raise ResourceRefused(
            f"GET {key} answered without a strong ETag ({answer.etag!r}): "
            'this resource cannot be written with kind = "etag"'
        )
    return answer.etag
