"""A click group whose subcommands are imported only when one is used (click's LazyGroup
pattern).

``keylane records get KEY`` needs the store and the settings; it does not need what
``keylane dlq`` or ``keylane sources`` import (the receiver, the lanes, Sentry, the Redis
client). Each lazy subcommand is named with the module and attribute that define it and
its short help: the module is imported when the command is run (or its own ``--help`` is
asked for), while ``keylane --help`` lists the names and short helps without importing
any of them. ``tests/test_cli_imports.py`` checks that the listing says what the commands,
once imported, would say.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a subcommand is defined (``"keylane.ops.cli_records:records"``), and its help
    in ``keylane --help``'s list (the first sentence of its own help)."""

    target: str
    short_help: str


class LazyGroup(click.Group):
    """A group with subcommands imported on first use; ``on_load`` is called once with
    each, when it is imported (the deployment options are added there)."""

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, LazyCommand],
        on_load: Callable[[click.Command], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.on_load = on_load

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            self.commands[cmd_name] = self.load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def load(self, name: str) -> click.Command:
        """Import the subcommand ``name``."""
        module_name, attribute = self.lazy[name].target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[name].target} is not a click command")
        self.on_load(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list of subcommands, as :class:`click.Group` writes it, with a lazy
        subcommand that is not imported yet shown by its short help."""
        listed: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name)
            if command is None and name in self.lazy:
                command = click.Command(name, help=self.lazy[name].short_help)
            if command is not None and not command.hidden:
                listed.append((name, command))
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in listed])
