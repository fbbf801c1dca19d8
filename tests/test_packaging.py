"""What the wheel and the sdist hold, whatever the checkout they are built from.

The project's folders (ops/, producers/, routing/, workers/) become keylane.ops,
keylane.producers, ... through pyproject.toml's explicit package list and package-dir,
not through the keylane/ links: a checkout without symbolic links must build the same
wheel, or none, never a wheel without the code.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from tests.support.packaging import (
    FOLDERS,
    build_sdist,
    build_wheel,
    declared_packages,
    package_folders,
    sdist_names,
    shipped_copy,
    wheel_names,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout (links and all)."""
    src = shipped_copy(tmp_path_factory.mktemp("src"))
    return build_wheel(src, tmp_path_factory.mktemp("wheel"))


def test_the_package_list_names_every_package_folder_of_the_tree() -> None:
    # Given the package list and mapping pyproject.toml declares
    packages, package_dir = declared_packages()
    # Then it names exactly the tree's package folders (a new subpackage must be added)
    assert set(packages) == package_folders()
    assert len(packages) == len(set(packages))
    # And each of the project's folders is mapped under the one import name
    assert package_dir == {f"keylane.{folder}": folder for folder in FOLDERS}


def test_the_wheel_ships_one_package_and_no_tests_or_benchmarks(wheel: Path) -> None:
    names = wheel_names(wheel)
    # Then everything is under the one import name
    assert {name.split("/")[0] for name in names} == {"keylane"}
    # And no test or benchmark module is inside it
    assert not [n for n in names if "/tests/" in n or "/bench" in n]
    # And the parts users run are there, with their data files
    for module in (
        "keylane/ops/cli.py",
        "keylane/workers/lanes.py",
        "keylane/workers/stores/postgres.py",
        "keylane/py.typed",
        "keylane/ops/examples/sources.toml",
    ):
        assert module in names


def test_a_checkout_without_symbolic_links_builds_the_same_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    # Given a checkout where the keylane/ links are text files (core.symlinks=false)
    src = shipped_copy(tmp_path / "src", links=False)
    assert (src / "keylane" / "workers").read_text() == "../workers"
    # When its wheel is built
    built = build_wheel(src, tmp_path / "wheel")
    # Then it holds exactly what the wheel of a checkout with links holds
    assert wheel_names(built) == wheel_names(wheel)


def test_the_sdist_has_the_project_layout_no_tests_and_builds_the_same_wheel(
    wheel: Path, tmp_path: Path
) -> None:
    # Given the sdist of this checkout
    sdist = build_sdist(shipped_copy(tmp_path / "src"), tmp_path / "sdist")
    names = sdist_names(sdist)
    # Then it has the project's folders, once (not a second copy under keylane/)
    assert "workers/lanes.py" in names
    assert "keylane/__init__.py" in names
    assert not [n for n in names if n.startswith(tuple(f"keylane/{f}/" for f in FOLDERS))]
    # And carries no tests, benchmarks or dev tooling (README says so)
    assert not [n for n in names if n.startswith(("tests/", "ops/bench/", "ops/dev"))]
    # And the wheel built from it, unpacked, is the same as the checkout's
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (root,) = (tmp_path / "unpacked").iterdir()
    assert wheel_names(build_wheel(root, tmp_path / "wheel")) == wheel_names(wheel)
