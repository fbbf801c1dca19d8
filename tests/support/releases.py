"""A previous release of keylane, run beside the current code: its source taken from this
repository's own history (``git archive``), installed into a venv of its own from the
lock file of that commit (``--require-hashes``: exactly the versions it was tested with),
kept between runs in the user's cache (``~/.cache/keylane/releases``, or
``KEYLANE_RELEASE_ENVS``), shared by every clone on the machine, built by one of them at
a time (a file lock), rebuilt when its stamp differs: the commit, the lock, the Python.

The release is found by its tag (``v0.1.0``) or, where the clone carries no tags (CI's
fresh clone of main), by its commit."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.stack import REPO

#: keylane 0.1.0: its tag, and the commit it names.
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "44bfee1"


def release_envs() -> Path:
    """Where built releases are kept."""
    if os.environ.get("KEYLANE_RELEASE_ENVS"):
        return Path(os.environ["KEYLANE_RELEASE_ENVS"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "keylane" / "releases"


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
    home = release_envs() / f"{commit[:12]}-py{version}"
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f"{home.name}.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another clone may be building it right now
        if not (home / "stamp").exists() or (home / "stamp").read_text() != stamp:
            _build(commit, home)
            (home / "stamp").write_text(stamp)
    return home / "venv" / "bin" / "python"


def _build(commit: str, home: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)
    source = home / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(
        f"git archive {commit} | tar -x -C {source}", shell=True, cwd=REPO, timeout=120
    )
    assert archive.returncode == 0
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True, timeout=120)
    pip = [str(home / "venv" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    for args in (
        ["--require-hashes", "-r", str(source / "ops/requirements-dev.txt")],
        ["--no-deps", "--no-build-isolation", str(source)],  # by its locked setuptools
    ):
        done = subprocess.run([*pip, "install", *args], capture_output=True, timeout=900)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def release_environ(base: dict[str, str]) -> dict[str, str]:
    """``base`` for a process of the installed release: nothing that would load the
    checkout's keylane instead (``PYTHONPATH``), nothing of this venv."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env
