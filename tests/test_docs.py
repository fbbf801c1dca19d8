"""The docs site (ops/mkdocs.yml, pages in ops/docs/) builds strictly, and what it says about
the code is read from the code: a broken link or anchor, a page left out of the navigation,
a marker the hook cannot fill, or a setting the pages name that does not exist fails here.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import get_args

import pytest

from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import env_var
from keylane.workers.store_rows import JournalOutcome
from tests.support.readme import DOCS, page_section, page_text
from tests.support.stack import REPO


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "ops/mkdocs.yml", "-d", out],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = built.stdout + built.stderr
    assert built.returncode == 0, log
    # (strict turns every warning into a failure; a warning that slipped through is one too)
    assert not [line for line in log.splitlines() if line.startswith("WARNING")], log
    return out


def test_the_site_builds_strictly_with_every_page_in_its_navigation(site: Path) -> None:
    # Given the pages in ops/docs, Then each was built into the site
    pages = sorted(p.relative_to(DOCS).with_suffix("") for p in DOCS.glob("*.md"))
    assert pages
    for page in pages:
        built = site / ("index.html" if page.name == "index" else f"{page}/index.html")
        assert built.exists(), page


def test_the_reference_is_the_code_s(site: Path) -> None:
    # Given the reference page as built
    reference = (site / "reference" / "index.html").read_text()
    # Then every setting is there with its variable
    for name in Settings.model_fields:
        assert env_var(name) in reference, name
    # And the commands with their options, as the click group has them (resolve's --note
    # is required, which the hand-written table once said it was not)
    assert 'id="keylane-dlq-resolve"' in reference
    resolve = reference.split('id="keylane-dlq-resolve"', 1)[1].split("<h3", 1)[0]
    assert "--note" in resolve
    assert "(required)" in resolve
    # And no marker is left unfilled
    assert "<!-- keylane:" not in reference


def test_every_variable_the_pages_name_is_a_setting() -> None:
    # Given every KEYLANE_* variable named on a page or in README
    known = {env_var(name) for name in Settings.model_fields}
    pages = [p.name for p in DOCS.glob("*.md")] + ["README.md"]
    named = {
        v for page in pages for v in re.findall(r"KEYLANE_[A-Z0-9_]*[A-Z0-9]", page_text(page))
    }
    # Then each is one the settings read (the few that are not settings say so here)
    not_settings = {"KEYLANE_PYTHON", "KEYLANE_TEST_RABBITMQ_SBIN"}  # ops/dev, the tests
    assert named - not_settings - known == set()


def test_the_benchmark_charts_are_drawn_from_their_printed_output(site: Path) -> None:
    # Given the benchmarks page as built
    page = (site / "benchmarks" / "index.html").read_text()
    # Then each chart is an inline SVG with the figures of the output it names
    assert page.count("<svg") >= 3
    versus = (DOCS / "bench" / "versus-defaults.txt").read_text()
    for figure in re.findall(r"^(?:keylane|celery-lock)\s+(\d+)", versus, re.M):
        assert f">{figure}</text>" in page, figure


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    # Given README
    readme = page_text("README.md")
    # Then it is a start, not the manual
    assert len(readme.splitlines()) <= 200
    # And it opens with the two set-up commands
    assert readme.startswith("# keylane\n\n```sh\nops/dev keylane up ")
    assert "\nops/dev test " in readme.split("```", 2)[1]


def test_the_changelog_tells_this_version_and_how_to_upgrade_to_it() -> None:
    # Given the version pyproject.toml gives the package
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    changelog = (REPO / "CHANGELOG.md").read_text()
    # Then the changelog's newest section is that version, and says how to upgrade to it
    sections = re.findall(r"^## (\S+)$", changelog, re.M)
    assert sections[0] == project["version"], sections
    newest = changelog.split(f"## {sections[0]}\n", 1)[1].split("\n## ", 1)[0]
    assert "### Upgrading from" in newest
    # And the previous release it names is the one the upgrade test runs
    assert sections[1] == "0.1.0"
    assert "44bfee1" in changelog


#: Where the code's own words live: every file in the tree a reader meets as text (help
#: texts, docstrings, comments), the tests' included.
CODE_GLOBS = ("**/*.py", "**/*.lua", "**/*.yml", "**/*.toml", "Dockerfile", "ops/dev")


def _code_files() -> list[Path]:
    skip = {".venv", ".git", "site", "node_modules", "build", "dist"}
    return sorted(
        path
        for pattern in CODE_GLOBS
        for path in REPO.glob(pattern)
        if path.is_file() and not skip.intersection(path.relative_to(REPO).parts)
    )


def test_every_readme_section_the_code_names_is_in_readme() -> None:
    # Given README's sections, and every section of README the code names in quotes (a help
    # text, a docstring, a comment: a quote may run over a line break and its comment mark)
    sections = {h.strip() for h in re.findall(r"^#+ (.+)$", page_text("README.md"), re.M)}
    named: dict[str, list[str]] = {}
    for path in _code_files():
        text = re.sub(r"\s*\n\s*(?:#|--)?\s*", " ", path.read_text(errors="replace"))
        for name in re.findall(r"README(?:'s)?,? \"([^\"]+)\"", text):
            named.setdefault(name, []).append(str(path.relative_to(REPO)))
    # Then README has each one (a section that moved to the site is named by its page)
    assert {n: where for n, where in named.items() if n not in sections} == {}


def test_every_docs_page_the_code_names_exists() -> None:
    # Given every page of ops/docs the code names by its path, Then that page is there
    named = {
        (page, str(path.relative_to(REPO)))
        for path in _code_files()
        for page in re.findall(r"ops/docs/([\w-]+\.md)", path.read_text(errors="replace"))
    }
    assert {(page, where) for page, where in named if not (DOCS / page).exists()} == set()


def test_every_outcome_is_in_concepts_and_refused_means_one_thing() -> None:
    # Given the journal's outcomes as the store names them, and Concepts as built from it
    outcomes = set(get_args(JournalOutcome))
    concepts = page_text("concepts.md")
    listed = page_section("concepts.md", "## The outcome")
    glossary = page_section("concepts.md", "## Glossary")
    # Then each outcome is in Concepts' list of outcomes, and "refused" in the glossary
    for outcome in outcomes:
        assert f"**{outcome.replace('_', '-')}**" in listed or f"**{outcome}**" in listed
    assert "| **refused** |" in glossary
    assert concepts.count("not_owned") >= 1
    # And no page, nor README, calls a field its source does not own "refused": that is a
    # `not_owned` dead letter, and "refused" is an outcome whose conditions did not hold
    pages = [p.name for p in DOCS.glob("*.md")] + ["README.md"]
    for page in pages:
        for sentence in re.split(r"(?<=[.;:|])\s", page_text(page)):
            if "refused" in sentence and ("not_owned" in sentence or "does not own" in sentence):
                raise AssertionError(f"{page}: {sentence!r}")


#: The characters of code a line holds at 1280 px between the navigation and the table of
#: contents (Material's 12.1rem sidebars, code at 0.85em of its 0.8rem text, 20px a rem).
CODE_CHARS_AT_1280_PX = 90


def test_getting_started_shows_every_expected_output_whole_at_1280_px(site: Path) -> None:
    # Given the languages whose code blocks extra.css wraps, and the built page
    css = (DOCS / "extra.css").read_text()
    wrapped = set(re.findall(r"\.language-(\w+)", css.split("pre-wrap")[0]))
    assert {"sh", "console"} <= wrapped, wrapped
    page = (site / "getting-started" / "index.html").read_text()
    assert "extra.css" in page
    # Then each block of Getting started either wraps, or has no line wider than the column
    text = page_text("getting-started.md")
    for chunk in text.split("```")[1::2]:
        info, _, body = chunk.partition("\n")
        if info.strip() in wrapped:
            assert f'class="language-{info.strip()} highlight"' in page
            continue
        wide = [line for line in body.splitlines() if len(line) > CODE_CHARS_AT_1280_PX]
        assert not wide, (info, wide)


def test_the_start_page_lists_every_guide_and_has_readmes_guarantees(site: Path) -> None:
    # Given the site's start page, as built
    index = (site / "index.html").read_text()
    # Then its guide list links every page of the navigation's Guides
    nav = (REPO / "ops" / "mkdocs.yml").read_text().split("  - Guides:", 1)[1]
    guides = re.findall(r"^      - .*?: ([\w-]+)\.md$", nav.split("\n  - ", 1)[0], re.M)
    assert "identities" in guides
    listed = page_section("index.md", "## Guides")
    assert [g for g in guides if f"]({g}.md)" not in listed] == []
    # And README's guarantees table is there, each promise of it, with working links
    promises = re.findall(
        r"^\| \*\*(.+?)\*\* \|", page_section("README.md", "## The guarantees"), re.M
    )
    assert len(promises) >= 10
    for promise in promises:
        assert html.escape(promise, quote=False) in index, promise
    assert 'href="failure-model/"' in index


#: How a lab notebook talks, not a manual: whose machine it was, what it was before.
NOTEBOOK = (
    "this project's",
    "other engineers",
    "was reworked",
    "facts.md",
    "(issue",
)


def test_the_pages_say_the_figures_the_machine_and_the_command_not_the_history() -> None:
    # Given every page and README, Then none talks like a lab notebook
    pages = [p.name for p in DOCS.glob("*.md")] + ["README.md"]
    found = [
        (page, phrase) for page in pages for phrase in NOTEBOOK if phrase in page_text(page).lower()
    ]
    assert found == []


def test_readme_says_how_long_the_tests_take_and_how_to_run_the_fast_ones() -> None:
    # Given README's words on the test suite
    readme = page_text("README.md")
    intro = readme.split("## ", 1)[0]
    # Then it says how long the whole suite and its fast tier take, in minutes
    assert re.search(r"`ops/dev test` .*?about \d+ minutes", intro, re.S), intro
    assert re.search(r'`ops/dev test -m "not slow"`.*?about [\d.]+ minutes', intro, re.S), intro
    # And the tier it names is one pytest selects: the slow marker is declared and used
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    assert any(m.startswith("slow:") for m in markers["ini_options"]["markers"])
    slow = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-n", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    selected = re.search(r"(\d+)/(\d+) tests collected", slow.stdout)
    assert selected is not None, slow.stdout[-2000:]
    assert 0 < int(selected.group(1)) < int(selected.group(2)), selected.group(0)
