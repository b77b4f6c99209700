"""The command group of ``efo`` and of its command groups: commands that load when used, and older
names. Only click here: ``efo --help`` and ``import efo.cli`` load no command's module, so that a
command pays for the AWS SDK, pydantic and the rest only when it needs them (tests/unit/test_cli_startup.py)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True, slots=True)
class Lazy:
    """A command that loads when used: ``module:attribute``, and its line in the group's ``--help``
    (the command's own ``short_help``, kept here so that the listing imports nothing; a unit test
    keeps the two equal)."""

    target: str
    short_help: str = ""

    def load(self) -> click.Command:
        module, _, attribute = self.target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


class Group(click.Group):
    """A command group whose commands may load when used (``lazy``, listed in ``--help`` in their
    order, before the commands added), with aliases (older names) that resolve but are not listed."""

    def __init__(self, *args: Any, lazy: dict[str, Lazy] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Lazy] = dict(lazy or {})
        self.aliases: dict[str, click.Command | Lazy] = {}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name) or self.lazy.get(cmd_name) or self.aliases.get(cmd_name)
        return found.load() if isinstance(found, Lazy) else found

    def list_commands(self, ctx: click.Context) -> list[str]:
        # in the order they were given, which is the order of use
        return [*self.lazy, *(name for name in self.commands if name not in self.lazy)]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's line with its short help; a lazy command's from its entry, not loaded."""
        shown: list[tuple[str, Lazy | click.Command]] = []
        for name in self.list_commands(ctx):
            command = self.lazy.get(name) or self.commands[name]
            if isinstance(command, Lazy) or not command.hidden:
                shown.append((name, command))
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        with formatter.section("Commands"):
            formatter.write_dl(
                [
                    (name, command.short_help if isinstance(command, Lazy) else command.get_short_help_str(limit))
                    for name, command in shown
                ]
            )


def examples(*lines: str) -> str:
    """A command's ``--help`` epilog: its examples, kept as written."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
