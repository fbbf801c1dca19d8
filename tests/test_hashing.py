"""routing/hashing.py: the record-key hash every process must agree on."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from keylane.routing.hashing import stable_hash

#: Answers of this release: a change here re-routes every key of a running deployment.
KNOWN = {
    "contact:42": 16001326631625990898,
    "": 16476032584258269876,
    "é": 14635220546840893743,
    "e": 1213901676569632079,
}


def test_known_keys_hash_to_the_values_every_release_has_given() -> None:
    assert {key: stable_hash(key) for key in KNOWN} == KNOWN


def test_another_process_with_another_hash_seed_gives_the_same_hashes() -> None:
    # Given a process whose built-in hash() is salted differently from this one's
    code = (
        "from keylane.routing.hashing import stable_hash\n"
        "print(hash('contact:42'), *(stable_hash(k) for k in ['contact:42', '', 'é', 'e']))"
    )
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    builtin, *theirs = out.stdout.split()
    # Then its built-in hash differs from this process's, and keylane's does not
    assert int(builtin) != hash("contact:42")
    assert [int(v) for v in theirs] == [stable_hash(k) for k in KNOWN] == list(KNOWN.values())


@given(st.text())
def test_every_key_hashes_to_an_unsigned_64_bit_integer(key: str) -> None:
    value = stable_hash(key)
    assert 0 <= value < 2**64
    assert stable_hash(key) == value
