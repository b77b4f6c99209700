"""``efo run`` (the service) and ``efo dev`` (the local AWS stack)."""

from __future__ import annotations

import click

from efo.cli.common import load_for_stream, settings_options
from efo.cli.group import examples


@click.command(
    "run",
    short_help="Consume the stream into the sink.",
    epilog=examples(
        "efo run --config efo.yaml",
        "EFO_SINK=parquet:s3a://bucket/orders efo run --stream orders --app billing",
        "efo run --config efo.yaml --until caught-up",
        "efo run --config efo.yaml --until 2026-01-31T00:00:00Z",
    ),
)
@settings_options
@click.option(
    "--until",
    metavar="WHEN",
    help="A bounded run (else EFO_RUN__UNTIL): stop once every shard is caught up ('caught-up') or has "
    "reached a time (ISO-8601 UTC, or a duration ago such as 2h); exit 0 then, 75 if stopped before.",
)
def run_command(config: str | None, stream: str | None, app: str | None, until: str | None) -> int:
    """Consume the stream into the sink until SIGTERM (then finish and checkpoint the running batch),
    or with --until until the stream is read to that point. With several streams configured,
    --stream runs one of them alone, with its entry's settings."""
    bounded = {"until": until} if until is not None else None
    settings = load_for_stream(config, stream, flags={"app": app, "run": bounded}, listed_only=True)
    from efo import spark_side  # the Spark side loads only for the command that runs it (pyspark: a Spark sink's)

    return spark_side.load().run(settings)


@click.command(
    "dev",
    short_help="The local AWS stack: up, env, stream, put, down.",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    epilog=examples(
        "efo dev up",
        'eval "$(efo dev env)"',
        "efo dev stream create orders --shards 2",
        "efo dev put orders --count 1000",
        "efo dev down",
    ),
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def dev_command(args: tuple[str, ...]) -> int:
    """The local AWS stack in the background, and streams and records on it: efo dev
    up|status|down|env|stream|put (efo dev --help)."""
    from efo.devstack.cli import main as dev_main  # its own parser: a tool of this repository, not of operators

    return dev_main(["dev", *args])
