"""The command tree of ``efo`` without AWS: help with examples everywhere, aliases, and ``--to``."""

from __future__ import annotations

from datetime import UTC, datetime

import click
import pytest
from click.testing import CliRunner

from efo.cli import COMMANDS, cli
from efo.cli.checkpoints import reset_position
from efo.errors import ConfigError
from efo.pipeline.records import Position


def every_command(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name in group.list_commands(click.Context(group)):
        paths.append((*path, name))
        command = group.get_command(click.Context(group), name)
        if isinstance(command, click.Group):
            paths += every_command(command, (*path, name))
    return paths


def command_at(path: tuple[str, ...]) -> click.Command:
    """The command at ``path`` (its groups' commands load when looked up: efo.cli.group.Lazy)."""
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None, path
        command = found
    return command


OPERATOR_COMMANDS = [
    ("consumers", "list"),
    ("consumers", "describe"),
    ("consumers", "register"),
    ("consumers", "deregister"),
    ("shards",),
    ("workers",),
    ("checkpoints", "show"),
    ("checkpoints", "reset"),
]


@pytest.mark.parametrize("path", [p for p in every_command(cli) if p != ("dev",)], ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:\n  efo " in result.output or "Examples:\n    efo " in result.output


@pytest.mark.parametrize("path", [p for p in every_command(cli) if p != ("dev",)], ids=" ".join)
def test_no_help_example_names_a_sink_scheme_hadoop_has_no_file_system_for(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert "parquet:s3://" not in result.output and "parquet:s3n://" not in result.output  # s3a://


@pytest.mark.parametrize("path", OPERATOR_COMMANDS, ids=" ".join)
def test_every_operator_command_takes_stream_app_config_and_json(path: tuple[str, ...]) -> None:
    command = command_at(path)
    options = {option for param in command.params for option in param.opts}
    assert {"--stream", "--app", "--config", "--json"} <= options


def test_the_older_names_resolve_to_the_new_commands_and_are_not_listed() -> None:
    context = click.Context(cli)
    consumers = cli.get_command(context, "consumer")
    assert consumers is command_at(("consumers",))
    assert isinstance(consumers, click.Group)
    assert consumers.get_command(context, "show") is consumers.commands["describe"]
    assert cli.get_command(context, "leases") is command_at(("checkpoints", "show"))
    assert "consumer" not in cli.list_commands(context) and "leases" not in cli.list_commands(context)


def test_each_command_is_listed_with_its_own_short_help_without_loading_it() -> None:
    """efo --help shows the short help kept beside each lazy command: the command's own."""
    context = click.Context(cli)
    assert cli.list_commands(context) == list(COMMANDS)
    for name, entry in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
        assert entry.short_help == command.get_short_help_str(), name


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("TRIM_HORIZON", Position("TRIM_HORIZON")),
        ("after:4960", Position("AFTER_SEQUENCE_NUMBER", "4960")),
        (
            "AT_TIMESTAMP:2026-01-31T12:00:00Z",
            Position("AT_TIMESTAMP", timestamp=datetime(2026, 1, 31, 12, tzinfo=UTC)),
        ),
    ],
)
def test_reset_position(text: str, position: Position) -> None:
    assert reset_position(text) == position


def test_reset_to_latest_means_the_moment_of_the_request() -> None:
    before = datetime.now(UTC)
    position = reset_position("LATEST")
    assert position.kind == "AT_TIMESTAMP" and position.timestamp is not None
    assert before <= position.timestamp <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("AFTER:12x", "--to 'AFTER:12x': AFTER needs a sequence number (digits), e.g. AFTER:4959..."),
        (
            "YESTERDAY",
            "--to 'YESTERDAY': allowed: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>, AFTER:<sequence number>",
        ),
    ],
)
def test_reset_position_names_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        reset_position(text)
    assert str(info.value) == message


WAITING_COMMANDS = [p for p in every_command(cli) if "--wait-s" in CliRunner().invoke(cli, [*p, "--help"]).output]


def test_the_commands_that_wait_are_found() -> None:
    assert {("consumers", "register"), ("consumers", "deregister"), ("checkpoints", "reset"), ("selftest",)} <= set(
        WAITING_COMMANDS
    )


@pytest.mark.parametrize("path", WAITING_COMMANDS, ids=" ".join)
def test_wait_s_takes_a_duration_with_its_unit_as_every_duration_does(path: tuple[str, ...]) -> None:
    """Issue 39: durations are accepted with units wherever a duration is asked, said the same way."""
    command = command_at(path)
    for text, seconds in (("5m", 300.0), ("90s", 90.0), ("2.5", 2.5)):
        context = command.make_context(path[-1], ["--wait-s", text], resilient_parsing=False)
        assert context.params["wait_s"] == seconds, text
    with pytest.raises(click.BadParameter) as refused:
        command.make_context(path[-1], ["--wait-s", "soon"])
    assert "allowed: a duration" in refused.value.format_message()
