"""``efo selftest``: the whole path on throwaway resources of a real account (efo/selftest/)."""

from __future__ import annotations

import click

from efo.aws import sdk_region
from efo.cli.common import confirm, operator_logging, refuse_without_terminal, say, wait_s_option
from efo.cli.group import examples
from efo.config import load_settings
from efo.errors import EXIT_OK, ConfigError
from efo.selftest.run import Plan, SelfTest

#: Stand-ins for the settings selftest does not use (it names its own stream, application and sink).
_UNUSED = {"stream": "efo-selftest", "app": "efo-selftest", "sink": "console"}


@click.command(
    "selftest",
    short_help="The whole path on a throwaway stream and table.",
    epilog=examples("efo selftest", "EFO_REGION=eu-west-1 efo selftest --yes --records 5000"),
)
@click.option("--config", metavar="FILE", help="YAML settings file: its region and endpoints are used.")
@click.option("--shards", type=click.IntRange(1, 8), default=2, show_default=True, help="Shards of the stream.")
@click.option("--records", type=click.IntRange(2, 100_000), default=1000, show_default=True, help="Records to put.")
@click.option("--yes", is_flag=True, help="Do not ask first (needed without a terminal).")
@wait_s_option(300.0)
def selftest_command(config: str | None, shards: int, records: int, yes: bool, wait_s: float) -> int:
    """Create a stream (with a unique efo-selftest- name), put records, start a worker that registers
    the consumer and creates the table, split a shard while it reads, put more, wait until every
    record arrived, check that each arrived at least once and in order per key, and delete everything
    it made, also when a step fails or it is interrupted (Ctrl-C, SIGTERM). Says what it will create
    and roughly what it costs, and asks first on a terminal. Exit 0 when verified and cleaned up."""
    refuse_without_terminal("create a stream, a consumer and a table", yes=yes)
    settings = load_settings(config, defaults=_UNUSED)
    region = settings.region or sdk_region()[0]
    if region is None:
        raise ConfigError("no AWS region: set EFO_REGION (or AWS_DEFAULT_REGION)")
    operator_logging()
    plan = Plan.new(region, shards=shards, records=records)
    for line in plan.lines():
        say(line)
    confirm("Go ahead?", yes=yes)
    outcome = SelfTest(plan, settings, say=lambda line: say(f"  {line}"), timeout_s=wait_s).run()
    for line in outcome.lines:
        say(line)
    if outcome.left:
        click.echo(f"efo: selftest left {len(outcome.left)} resource(s): " + "; ".join(outcome.left), err=True)
    elif outcome.exit_code != EXIT_OK:
        click.echo(f"efo: selftest {outcome.lines[0]}; everything it made is deleted", err=True)
    return outcome.exit_code
