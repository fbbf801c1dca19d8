"""Building keylane's wheel and sdist the way users and the Dockerfile do, from a clean
copy of this checkout's shipped files (a ``build/`` directory left in the checkout could
carry modules that no longer exist)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

from tests.support.stack import REPO

#: What the wheel and sdist are built from (what the Dockerfile copies).
SHIPPED = (
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "keylane",
    "routing",
    "producers",
    "workers",
    "ops",
)
#: The folders pyproject.toml's package-dir maps under the one import name.
FOLDERS = ("ops", "producers", "routing", "workers")


def shipped_copy(dest: Path, *, links: bool = True) -> Path:
    """Copy the shipped files to ``dest``. With ``links=False`` the ``keylane/`` links
    become what a checkout without symbolic links has in their place: text files holding
    the link's target (``git clone -c core.symlinks=false``, the default on Windows)."""
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, symlinks=True, ignore=junk)
        else:
            shutil.copy2(REPO / name, dest / name)
    if not links:
        for link in (dest / "keylane").iterdir():
            if link.is_symlink():
                target = str(link.readlink())
                link.unlink()
                link.write_text(target)
    return dest


def build_wheel(src: Path, out: Path) -> Path:
    """``pip wheel`` of ``src`` (isolated build, as pip builds for users); its one wheel."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = out.glob("keylane-*.whl")
    return wheel


def build_sdist(src: Path, out: Path) -> Path:
    """The sdist of ``src``, built by the installed setuptools' PEP 517 backend."""
    code = f"import setuptools.build_meta as b; b.build_sdist({str(out)!r})"
    built = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True)
    assert built.returncode == 0, f"build_sdist failed:\n{built.stdout}\n{built.stderr}"
    (sdist,) = out.glob("keylane-*.tar.gz")
    return sdist


def wheel_names(wheel: Path) -> set[str]:
    """The files in a wheel, without its ``.dist-info`` (whose RECORD holds hashes)."""
    return {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}


def sdist_names(sdist: Path) -> set[str]:
    """The files in an sdist, relative to its top folder."""
    with tarfile.open(sdist) as archive:
        return {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}


def declared_packages() -> tuple[list[str], dict[str, str]]:
    """The package list and package-dir mapping that pyproject.toml declares."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["packages"], config["package-dir"]


def package_folders() -> set[str]:
    """The import names of the tree's package folders (those with ``__init__.py``, and
    the folders of Lua scripts, data only), benchmarks excluded: what the package list
    must name."""
    found = {"keylane"}
    for folder in FOLDERS:
        for marker in [*(REPO / folder).rglob("__init__.py"), *(REPO / folder).rglob("*.lua")]:
            relative = marker.parent.relative_to(REPO)
            if relative.parts[:2] == ("ops", "bench"):
                continue
            found.add(".".join(("keylane", *relative.parts)))
    return found


def direct_requirements() -> list[str]:
    """keylane's direct dependencies as pyproject.toml declares them (name, extras, range)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def dev_requirements() -> list[str]:
    """The dev extra's requirements as pyproject.toml declares them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["dev"])


def requirement_name(spec: str) -> str:
    """The distribution name of a requirement (``celery[redis]~=5.7.0`` -> ``celery``)."""
    return re.split(r"[\[<>=~!; ]", spec, maxsplit=1)[0]
