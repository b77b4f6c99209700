"""``efo config validate|show|table``: the settings, checked, explained, and as the README's table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from efo.aws import sdk_region
from efo.cli.common import (
    Column,
    json_option,
    load_for_stream,
    print_json,
    print_table,
    say,
    select_stream,
    settings_options,
)
from efo.cli.group import examples
from efo.config import (
    STREAM_ENTRY_KEYS,
    Settings,
    SettingSource,
    load_settings,
    redacted,
    setting_locations,
    setting_sources,
    settings_table,
    stream_name,
)
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
    """Exit 0 when the settings are valid, 2 naming every bad one; makes no AWS call. With several
    streams configured, --stream checks the settings of that one."""
    settings = load_for_stream(config, stream, flags={"app": app})
    names = settings.stream_names
    if as_json:
        print_json(
            {"valid": True, "stream": settings.stream, "streams": names, "app": settings.app, "sink": settings.sink}
        )
    else:
        streams = f"stream={settings.stream}" if settings.stream else f"streams={','.join(names)}"
        say(f"configuration is valid: {streams} app={settings.app} sink={settings.sink}")
    return EXIT_OK


def _streams_configured(config: str | None, flags: Mapping[str, str | None]) -> bool:
    return setting_sources(config, flags=flags)["streams"].kind != "default"


def settings_records(config: str | None, stream: str | None, app: str | None) -> list[dict[str, Any]]:
    """The ``--json`` shape of ``config show``: every setting, its effective value (secrets
    redacted), and where it came from (``source``: default, file, environment or flag; ``origin``:
    the file, the variable or the flag), with ``stream`` null; then each stream's own settings
    (:func:`stream_records`). With ``streams`` configured, ``--stream`` selects the stream shown
    instead of replacing the list."""
    selects = stream is not None and _streams_configured(config, {"app": app})
    flags = {"app": app} if selects else {"stream": stream, "app": app}
    settings = load_settings(config, defaults={"sink": "console"}, flags=flags)
    values = settings.model_dump(mode="json")
    sources = setting_sources(config, flags=flags)
    records = []
    for location in setting_locations():
        value: Any = values
        for name in location:
            value = value[name]
        dotted = ".".join(location)
        value, source = _effective(settings, dotted, value, sources[dotted])
        records.append(_record(None, dotted, redacted(location, value), source, None))
    chosen = [select_stream(settings, stream)] if selects and stream is not None else settings.per_stream()
    for each in chosen:
        records += stream_records(settings, each, sources, selected_by_flag=selects)
    return records


#: A required setting that is not set (the sink: operator commands need none, ``efo run`` does).
MISSING = "missing"


def _effective(settings: Settings, setting: str, value: Any, source: SettingSource) -> tuple[Any, SettingSource]:
    """What ``efo run`` would use where the settings leave a value to something else: ``table`` and
    ``consumer_name`` default to the application (origin ``app``), ``region`` to the AWS SDK's
    (origin: where the SDK found it); a sink not set is missing, not a console sink."""
    if source.kind != "default":
        return value, source
    if setting == "sink":
        return None, SettingSource("missing")
    if setting == "table" or (setting == "consumer_name" and settings.consumer_arn is None):
        return settings.app, SettingSource("default", "app")
    if setting == "region":
        region, origin = sdk_region()
        return region, SettingSource("default", origin or "")
    return value, source


def stream_records(
    settings: Settings, each: Settings, sources: Mapping[str, SettingSource], *, selected_by_flag: bool
) -> list[dict[str, Any]]:
    """One stream's effective ``stream``, ``initial_position``, ``skip_older_than``,
    ``consumer_name`` and ``consumer_arn``, and where each came from: its entry in ``streams``
    (``entry``: its number in the list, 1 for the first), else the top level or the default
    (``entry`` null). A stream not in ``streams`` named with --stream has the top level's."""
    name = stream_name(each.stream_ref)
    number, entry = next(
        ((n, e) for n, e in enumerate(settings.streams or [], 1) if e.name == name),
        (None, None),
    )
    records = []
    for key in STREAM_ENTRY_KEYS:
        value = redacted((key,), getattr(each, key))
        cleared = key == "consumer_arn" and settings.consumer_arn is not None and each.consumer_arn is None
        if entry is not None and (key in entry.given() or cleared):  # an entry's consumer_name clears consumer_arn
            records.append(_record(name, key, value, sources["streams"], number))
        elif key == "stream" and selected_by_flag:
            records.append(_record(name, key, value, SettingSource("flag", "--stream"), None))
        else:
            records.append(_record(name, key, *_effective(each, key, value, sources[key]), None))
    return records


def _record(stream: str | None, setting: str, value: Any, source: SettingSource, entry: int | None) -> dict[str, Any]:
    return {
        "stream": stream,
        "setting": setting,
        "value": value,
        "source": source.kind,
        "origin": source.origin or None,
        "entry": entry,
    }


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _source_text(record: dict[str, Any]) -> str:
    if record["source"] == MISSING:
        return f"{MISSING} (required by efo run)"
    origin = record["origin"]
    if record["source"] == "default":
        return "default" + (f" ({origin})" if origin else "")
    text = str(record["source"]) + (f" {origin}" if origin else "")
    return text + (f" (streams entry {record['entry']})" if record["entry"] else "")


SETTING_COLUMNS = (
    Column("setting", lambda r: r["setting"]),
    Column("value", lambda r: _text(r["value"])),
    Column("source", _source_text),
)
STREAM_SETTING_COLUMNS = (Column("stream", lambda r: r["stream"]), *SETTING_COLUMNS)


@config.command(
    "show",
    short_help="The effective settings and their sources.",
    epilog=examples(
        "efo config show --config efo.yaml --app billing",
        "efo config show --config efo.yaml --stream payments",
        "efo config show --json | jq '.[] | select(.source != \"default\")'",
    ),
)
@settings_options
@json_option
def show_command(config: str | None, stream: str | None, app: str | None, as_json: bool) -> int:
    """The effective settings and where each came from (default, file, environment, flag), with
    secrets redacted; then each stream's own settings (of every configured stream, or of the one
    --stream names) and whether its entry in streams, the top level or the default sets them. The
    values are those efo run would use: a table or consumer name not set shows the application's, a region
    not set the AWS SDK's (and where it found it), a sink not set shows as missing."""
    records = settings_records(config, stream, app)
    if as_json:
        print_json(records)
        return EXIT_OK
    print_table([r for r in records if r["stream"] is None], SETTING_COLUMNS, empty="")
    print()
    print_table([r for r in records if r["stream"] is not None], STREAM_SETTING_COLUMNS, empty="")
    return EXIT_OK


@config.command("table", short_help="The README's settings table.", epilog=examples("efo config table > settings.md"))
def table_command() -> int:
    """The README's settings table (Markdown), generated from the settings' definitions."""
    say(settings_table())
    return EXIT_OK
