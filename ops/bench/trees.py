"""Another revision of this repository, for the receiver benchmark's ``--against REV``:
its files taken from the repository's history (``git archive``, which leaves the
repository's worktrees and refs untouched) and installed into a venv of its own from ITS
OWN lock (``ops/requirements-dev.txt``, hashes required, then keylane itself without
dependencies), so that it runs on the versions it was released with.

Both are cached under :data:`TREES_DIR`, keyed by the revision's full hash: a second run
against the same revision starts at once. A venv is used only once its stamp is written,
last (a build cut short is built again from nothing), and one build runs at a time per
revision (a lock file), so two benchmarks may share the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .procs import REPO, BenchFailure, say

#: Where revisions' trees and venvs are kept between runs (one folder per commit hash).
TREES_DIR = Path(tempfile.gettempdir()) / "keylane-bench-trees"
LOCK_FILE = "ops/requirements-dev.txt"
#: Written last into a venv that holds its lock and its keylane.
STAMP = ".keylane-bench-built"
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Tree:
    """One revision, unpacked and installed: what serves it."""

    commit: str  # the full hash
    root: Path  # its files
    venv: Path

    @property
    def label(self) -> str:
        """The short hash that names it in the report."""
        return self.commit[:7]

    def keylane_argv(self, *args: str) -> list[str]:
        """``keylane ARGS`` run by this revision's venv, to be started in :attr:`root`:
        ``python -m`` looks in the working directory first, and finds this revision's own
        ``keylane/`` there, never this checkout's."""
        return [str(self.venv / "bin" / "python"), "-m", "keylane.ops.cli", *args]


def resolve(rev: str, repo: Path = REPO) -> str:
    """The full hash of the commit ``rev`` names; :class:`BenchFailure` if none."""
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise BenchFailure(f"--against {rev}: not a commit of {repo}")
    return found.stdout.strip()


def cache_of(commit: str, base: Path = TREES_DIR) -> tuple[Path, Path]:
    """Where the revision's files and venv live: ``<base>/<commit>/tree`` and ``venv``."""
    return base / commit / "tree", base / commit / "venv"


def install_argvs(python: str, root: Path, venv: Path) -> list[list[str]]:
    """The commands that build ``venv`` for the tree at ``root`` with ``python``: the
    venv, the tree's lock with every hash checked, keylane from the tree without
    dependencies (built by the lock's setuptools: nothing else is fetched)."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    return [
        [python, "-m", "venv", str(venv)],
        [*pip, "install", "--require-hashes", "-r", str(root / LOCK_FILE)],
        [*pip, "install", "--no-deps", "--no-build-isolation", str(root)],
    ]


def stamp_of(commit: str) -> str:
    """What a built venv's stamp holds: the commit and the Python it was built with."""
    return f"{commit} {sys.version.split()[0]}\n"


def prepare(rev: str, base: Path = TREES_DIR) -> Tree:
    """Revision ``rev`` unpacked and installed (from the cache when it is there)."""
    commit = resolve(rev)
    root, venv = cache_of(commit, base)
    with _locked(base / f"{commit}.lock"):
        if not root.is_dir():
            say(f"--against {rev}: unpacking {commit[:7]} into {root}")
            unpack(commit, root)
        if _read(venv / STAMP) != stamp_of(commit):
            say(f"--against {rev}: installing its lock into {venv} (once per revision)")
            _build(root, venv)
            (venv / STAMP).write_text(stamp_of(commit))
    return Tree(commit, root, venv)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def unpack(commit: str, root: Path) -> None:
    """``git archive`` of ``commit`` extracted into ``root``, which appears whole or not
    at all (extracted beside it, then renamed)."""
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    archive = root.with_name(root.name + ".tar")
    _run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit])
    with tarfile.open(archive) as tar:
        tar.extractall(partial, filter="tar")  # keylane/'s links point inside the tree
    archive.unlink()
    partial.rename(root)


def _build(root: Path, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    for argv in install_argvs(sys.executable, root, venv):
        _run(argv, cwd=root)


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise BenchFailure(
            f"{' '.join(argv)} exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
