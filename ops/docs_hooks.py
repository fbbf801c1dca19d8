"""The docs site's MkDocs hook (``ops/mkdocs.yml``): the parts of its pages the code writes.

A page asks for them with a marker line of its own:

    <!-- keylane:cli -->        every ``keylane`` command and option, read from the click group
    <!-- keylane:settings -->   every setting: its variable, type, default, bounds and the
                                comment the code gives it, read from the settings model
    <!-- keylane:chart FILE COLUMN -->
                                a bar chart of COLUMN in each table of FILE, a benchmark's
                                output as it printed it (FILE relative to the docs folder)
    <!-- keylane:readme "HEADING" -->
                                README's section under ``## HEADING`` (its links to
                                ``ops/docs/`` made the site's), so the site and README
                                say it once

So the reference cannot drift from the code, and a chart shows the figures the command
printed. A marker that names no file or column fails the build.

MkDocs loads this file by its path, not as part of the package: hence the absolute imports.
"""

from __future__ import annotations

import html
import inspect
import io
import re
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic.fields import FieldInfo

from keylane.ops.cli import cli
from keylane.routing.contract import settings as settings_module
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import env_var

MARKER = re.compile(r"^<!-- keylane:(\w+)(.*?)-->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: each marker of a page replaced by what it asks for."""
    docs = Path(config["docs_dir"])
    return MARKER.sub(lambda m: generated(m.group(1), shlex.split(m.group(2)), docs), markdown)


def generated(kind: str, args: list[str], docs: Path) -> str:
    """The Markdown (or inline SVG) a marker stands for."""
    if kind == "cli":
        return cli_reference(cli)
    if kind == "settings":
        return settings_reference()
    if kind == "chart" and len(args) == 2:
        return bar_chart(read_tables((docs / args[0]).read_text()), args[1], args[0])
    if kind == "readme" and len(args) == 1:
        return readme_section((docs.parent.parent / "README.md").read_text(), args[0])
    raise ValueError(f"unknown docs marker: keylane:{kind} {args}")


def readme_section(readme: str, heading: str) -> str:
    """The body of README's ``## heading`` section, up to the next heading of its level,
    with README's links into the docs folder as links between the site's pages."""
    parts = re.split(rf"^## {re.escape(heading)}\n", readme, maxsplit=1, flags=re.M)
    if len(parts) != 2:
        raise ValueError(f"README has no section ## {heading}")
    body = re.split(r"^## ", parts[1], maxsplit=1, flags=re.M)[0]
    return re.sub(r"\]\(ops/docs/", "](", body).strip() + "\n"


# -- the CLI ------------------------------------------------------------------------------


def cli_reference(group: click.Group) -> str:
    """A section per command (groups walked), the deployment options once, at the top."""
    shared = {param.name for param in group.params}
    parts = ["### Options every command takes\n", options_table(group.params)]
    for name, command in walk(group, "keylane"):
        own = [p for p in command.params if p.name not in shared]
        help_text = inspect.cleandoc(command.help or "")
        parts += [f"### `{name}`\n", usage(name, own), "", help_text, ""]
        if any(isinstance(p, click.Option) for p in own):
            parts.append(options_table(own))
    return "\n".join(parts)


def walk(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group``, with its full name, in the order of names (a lazy
    subcommand imported here: its options are only known then)."""
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None:
            continue
        if isinstance(command, click.Group):
            yield from walk(command, f"{prefix} {name}")
        elif not command.hidden:
            yield f"{prefix} {name}", command


def usage(name: str, params: list[click.Parameter]) -> str:
    """The command's synopsis: its arguments, and [OPTIONS] when it has any."""
    words = [
        name,
        *(p.human_readable_name.upper() for p in params if p.param_type_name == "argument"),
    ]
    if any(isinstance(p, click.Option) for p in params):
        words.append("[OPTIONS]")
    return f"```\n{' '.join(words)}\n```"


def options_table(params: list[click.Parameter]) -> str:
    """One row per option: its spellings, what it takes, and its help."""
    rows = ["| option | takes | what it does |", "|---|---|---|"]
    for param in params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        flags = ", ".join(f"`{flag}`" for flag in [*param.opts, *param.secondary_opts])
        takes = "flag" if param.is_flag else param.type.name.upper()
        if param.required:
            takes += " (required)"
        if param.multiple:
            takes += ", repeatable"
        rows.append(f"| {flags} | {takes} | {cell(param.help or '')} |")
    return "\n".join(rows) + "\n"


def cell(text: str) -> str:
    """Text for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


# -- the settings --------------------------------------------------------------------------


def settings_reference() -> str:
    """One row per field of :class:`Settings`, in the model's order."""
    notes = field_comments(Path(settings_module.__file__).read_text())
    rows = [
        "| setting | environment variable | type | default | bounds | the code says |",
        "|---|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        rows.append(
            f"| `{name}` | {variables(name, field)} | `{cell(type_name(field.annotation))}` "
            f"| {default_of(field)} | {bounds(field)} | {cell(notes.get(name, ''))} |"
        )
    return "\n".join(rows) + "\n"


def variables(name: str, field: FieldInfo) -> str:
    """The variables that set the field: its alias choices, else ``KEYLANE_<NAME>``."""
    alias = field.validation_alias
    choices = getattr(alias, "choices", None) or [env_var(name)]
    return ", ".join(f"`{choice}`" for choice in choices)


def type_name(annotation: Any) -> str:
    """``int``, ``Path | None``, ``Literal['text', 'json']``: as the code writes it."""
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    return re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Za-z_])", "", text)


def default_of(field: FieldInfo) -> str:
    """The default as a user would write it; a factory's default is computed."""
    if field.default_factory is not None:
        return f"`{field.get_default(call_default_factory=True)!r}`"
    if field.default is None:
        return "unset"
    return f"`{field.default}`"


def bounds(field: FieldInfo) -> str:
    """The field's numeric bounds (``>= 1``, ``<= 64``)."""
    found = []
    for rule in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(rule, attr, None) is not None:
                found.append(f"{sign} {getattr(rule, attr)}")
    return ", ".join(found)


def field_comments(source: str) -> dict[str, str]:
    """The comments the settings' source gives each field of the ``Settings`` class: the
    block right above a field (one that runs into the next field without a blank line
    is given to the first field only) and the one at the end of its line."""
    notes: dict[str, str] = {}
    block: list[str] = []
    inside = False
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string == "class" and token.start[1] == 0:
            inside = False
        if token.type == tokenize.NAME and token.string == "Settings" and token.start[1] == 6:
            inside = True
        if not inside:
            continue
        if token.type == tokenize.COMMENT and token.start[1] == 4:
            block.append(token.string.lstrip("# "))
        elif token.type == tokenize.COMMENT:
            field = token.line.split(":", 1)[0].strip()
            notes[field] = " ".join(filter(None, [notes.get(field), token.string.lstrip("# ")]))
        elif token.type == tokenize.NL and not token.line.strip():
            block = []
        elif (
            token.type == tokenize.NAME
            and token.start[1] == 4
            and token.line[4:].split(":")[0].isidentifier()
        ):
            if block and ":" in token.line and token.string not in notes:
                notes[token.string] = " ".join(block)
            block = []
    # A one- or two-word block ("# Receiver") titles the fields below it: not a note.
    return {
        name: note
        for name, note in notes.items()
        if name in Settings.model_fields and (len(note.split()) > 2 or not note[:1].isupper())
    }


# -- charts ---------------------------------------------------------------------------------


@dataclass
class Table:
    """A table a benchmark printed: its title (the line above it), columns and rows."""

    title: str
    columns: list[str]
    rows: list[list[str]]


def read_tables(text: str) -> list[Table]:
    """Every table of a benchmark's output: a header line of upper-case column names
    (two spaces or more between them) and the rows under it with as many cells."""
    tables: list[Table] = []
    title = ""
    current: Table | None = None
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if current and len(cells) == len(current.columns):
            current.rows.append(cells)
            continue
        current = None
        if len(cells) > 2 and all(c == c.upper() for c in cells) and re.match(r"[A-Z]", cells[0]):
            current = Table(title, cells, [])
            tables.append(current)
        elif line.startswith(("==", "(")):
            title = line.strip("= ") if line.startswith("==") else line.strip()
    return tables


BAR_HEIGHT = 22
LABEL_WIDTH = 150
CHART_WIDTH = 640


def bar_chart(tables: list[Table], column: str, source: str) -> str:
    """A horizontal bar chart of ``column``: a group of bars per table, one per row."""
    groups = [
        (t.title, [(r[0], number(r[t.columns.index(column)])) for r in t.rows])
        for t in tables
        if column in t.columns
    ]
    if not groups:
        raise ValueError(f"{source}: no table has a column {column!r}")
    top = max(value for _, bars in groups for _, value in bars) or 1.0
    scale = (CHART_WIDTH - LABEL_WIDTH - 70) / top
    shapes: list[str] = []
    y = 0
    for title, bars in groups:
        shapes.append(f'<text x="0" y="{y + 15}" font-weight="bold">{html.escape(title)}</text>')
        y += BAR_HEIGHT
        for label, value in bars:
            width = max(value * scale, 1)
            colour = "#3f51b5" if label.startswith("keylane") else "#9e9e9e"
            shapes.append(
                f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end">'
                f"{html.escape(label)}</text>"
                f'<rect x="{LABEL_WIDTH}" y="{y + 3}" width="{width:.1f}" '
                f'height="{BAR_HEIGHT - 6}" fill="{colour}"/>'
                f'<text x="{LABEL_WIDTH + width + 6:.1f}" y="{y + 15}">{value:g}</text>'
            )
            y += BAR_HEIGHT
        y += 8
    name = html.escape(f"{column}, from {source}")
    return (
        f'<figure class="keylane-chart"><svg xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {CHART_WIDTH} {y}" width="{CHART_WIDTH}" font-family="sans-serif" '
        f'font-size="13"><title>{name}</title>{"".join(shapes)}</svg>'
        f"<figcaption>{name}</figcaption></figure>\n"
    )


def number(text: str) -> float:
    """A cell's number (``1,238``, ``0.70``)."""
    return float(text.replace(",", ""))
