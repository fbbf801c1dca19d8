"""A hash of record keys that is the same in every process, host and Python version.

Python's built-in ``hash()`` is salted per process (PYTHONHASHSEED), so two receivers
would route one key to two shards. BLAKE2b is in the standard library, fast for short
keys, and its output is fixed by RFC 7693.
"""

from hashlib import blake2b

_DIGEST_BYTES = 8


def stable_hash(key: str) -> int:
    """Return a 64-bit unsigned hash of ``key`` (UTF-8), identical everywhere."""
    digest = blake2b(key.encode("utf-8"), digest_size=_DIGEST_BYTES).digest()
    return int.from_bytes(digest, "big")
