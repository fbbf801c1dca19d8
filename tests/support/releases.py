"""A previous release of keylane, run beside the current code: its source taken from this
repository's own history (``git archive``), installed into a venv of its own from the
lock file of that commit (``--require-hashes``: exactly the versions it was tested with),
kept under ``.release-envs/`` between runs (rebuilt when its stamp differs: the commit,
the lock, the Python).

The release is found by its tag (``v0.1.0``) or, where the clone carries no tags (CI's
fresh clone of main), by its commit."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.stack import REPO

#: keylane 0.1.0: its tag, and the commit it names.
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "44bfee1"

RELEASE_ENVS = REPO / ".release-envs"


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, timeout=120)


def release_commit(tag: str = PREVIOUS_TAG, commit: str = PREVIOUS_COMMIT) -> str | None:
    """The full hash of the release: its tag, else its commit; None when neither is in
    this clone's history."""
    for name in (f"{tag}^{{commit}}", f"{commit}^{{commit}}"):
        found = git("rev-parse", "--verify", "--quiet", name)
        if found.returncode == 0:
            return found.stdout.decode().strip()
    return None


def release_env(commit: str) -> Path:
    """The ``python`` of a venv where ``commit``'s keylane is installed (built once)."""
    lock = git("show", f"{commit}:ops/requirements-dev.txt")
    assert lock.returncode == 0, lock.stderr
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stamp = hashlib.sha256(commit.encode() + lock.stdout + sys.version.encode()).hexdigest()
    home = RELEASE_ENVS / f"{commit[:12]}-py{version}"
    python = home / "venv" / "bin" / "python"
    if (home / "stamp").exists() and (home / "stamp").read_text() == stamp:
        return python
    shutil.rmtree(home, ignore_errors=True)
    source = home / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(
        f"git archive {commit} | tar -x -C {source}", shell=True, cwd=REPO, timeout=120
    )
    assert archive.returncode == 0
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True, timeout=120)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    for args in (
        ["--require-hashes", "-r", str(source / "ops/requirements-dev.txt")],
        ["--no-deps", "--no-build-isolation", str(source)],  # by its locked setuptools
    ):
        done = subprocess.run([*pip, "install", *args], capture_output=True, timeout=900)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    (home / "stamp").write_text(stamp)
    return python


def release_environ(base: dict[str, str]) -> dict[str, str]:
    """``base`` for a process of the installed release: nothing that would load the
    checkout's keylane instead (``PYTHONPATH``), nothing of this venv."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env
