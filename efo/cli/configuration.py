"""``efo config validate|show|table``: the settings, checked, explained, and as the README's table."""

from __future__ import annotations

import json
from typing import Any

import click

from efo.cli.common import Column, examples, json_option, print_json, print_table, say, settings_options
from efo.config import load_settings, redacted, setting_locations, setting_sources, settings_table
from efo.errors import EXIT_OK


@click.group(
    short_help="Validate the settings, show where each comes from.",
    epilog=examples("efo config validate --config efo.yaml", "efo config show --config efo.yaml"),
)
def config() -> None:
    """Check the configuration, show where each setting comes from, print the README's table."""


@config.command(
    "validate",
    short_help="Check the settings; no AWS call.",
    epilog=examples("efo config validate --config efo.yaml", "EFO_STREAM=orders efo config validate --app billing"),
)
@settings_options
@json_option
def validate_command(config: str | None, stream: str | None, app: str | None, as_json: bool) -> int:
    """Exit 0 when the settings are valid, 2 naming every bad one; makes no AWS call."""
    settings = load_settings(config, flags={"stream": stream, "app": app})
    if as_json:
        print_json({"valid": True, "stream": settings.stream, "app": settings.app, "sink": settings.sink})
    else:
        say(f"configuration is valid: stream={settings.stream} app={settings.app} sink={settings.sink}")
    return EXIT_OK


def settings_records(config: str | None, flags: dict[str, str | None]) -> list[dict[str, Any]]:
    """The ``--json`` shape of ``config show``: every setting, its effective value (secrets
    redacted), and where it came from (``source``: default, file, environment or flag; ``origin``:
    the file, the variable or the flag)."""
    settings = load_settings(config, defaults={"sink": "console"}, flags=flags)
    values = settings.model_dump(mode="json")
    sources = setting_sources(config, flags=flags)
    records = []
    for location in setting_locations():
        value: Any = values
        for name in location:
            value = value[name]
        dotted = ".".join(location)
        source = sources[dotted]
        records.append(
            {
                "setting": dotted,
                "value": redacted(location, value),
                "source": source.kind,
                "origin": source.origin or None,
            }
        )
    return records


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


SETTING_COLUMNS = (
    Column("setting", lambda r: r["setting"]),
    Column("value", lambda r: _text(r["value"])),
    Column("source", lambda r: r["source"] + (f" {r['origin']}" if r["origin"] else "")),
)


@config.command(
    "show",
    short_help="The effective settings and their sources.",
    epilog=examples(
        "efo config show --config efo.yaml --app billing",
        "efo config show --json | jq '.[] | select(.source != \"default\")'",
    ),
)
@settings_options
@json_option
def show_command(config: str | None, stream: str | None, app: str | None, as_json: bool) -> int:
    """The effective settings and where each came from (default, file, environment, flag), with
    secrets redacted. The sink defaults to console here (operator commands need none)."""
    records = settings_records(config, {"stream": stream, "app": app})
    if as_json:
        print_json(records)
    else:
        print_table(records, SETTING_COLUMNS, empty="")
    return EXIT_OK


@config.command("table", short_help="The README's settings table.", epilog=examples("efo config table > settings.md"))
def table_command() -> int:
    """The README's settings table (Markdown), generated from the settings' definitions."""
    say(settings_table())
    return EXIT_OK
