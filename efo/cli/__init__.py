"""The ``efo`` command: run the service, check its configuration, and operate it: consumers, shards,
workers and checkpoints. One module per command group; this one assembles them.

Exit codes of every command:

- 0: success
- 1: a runtime failure (an AWS error, a wait that timed out, a refusal because a live worker uses the
  consumer, a confirmation answered no, a check of ``efo doctor`` that failed, an ``efo selftest``
  that failed or was interrupted)
- 2: usage or configuration (a bad flag or setting, or ``--yes`` missing without a terminal to ask on)
- 3: a named resource not found (stream, consumer, lease table, application, shard); a listing of
  several streams still shows the others
- 75: a bounded run (``efo run --until``) stopped before its end (SIGTERM), or its final checkpoints
  and releases did not all land: run it again

Every error is one line on standard error, ``efo: <what>; <what to do>``, naming the resource.
"""

from __future__ import annotations

import click

from efo import __version__
from efo.cli.group import Group, Lazy, examples
from efo.errors import EXIT_CONFIG, EXIT_RUNTIME, EfoError

#: Every command, in the order of use, loaded when it runs: ``efo --help`` and one command import no
#: other command's module (each brings its own dependencies: the AWS SDK, the doctor, the selftest).
COMMANDS = {
    "run": Lazy("efo.cli.service:run_command", "Consume the stream into the sink."),
    "doctor": Lazy("efo.cli.doctor:doctor_command", "Check everything a deployment needs, before it runs."),
    "selftest": Lazy("efo.cli.selftest:selftest_command", "The whole path on a throwaway stream and table."),
    "consumers": Lazy("efo.cli.consumers:consumers", "List, describe, register and retire EFO consumers."),
    "shards": Lazy("efo.cli.shards:shards_command", "The shard tree; with --app, owners, checkpoints, lag."),
    "workers": Lazy("efo.cli.workers:workers_command", "Live and dead workers: heartbeats, leases, versions."),
    "checkpoints": Lazy("efo.cli.checkpoints:checkpoints", "Show checkpoints, and move them while running."),
    "config": Lazy("efo.cli.configuration:config", "Validate the settings, show where each comes from."),
    "dev": Lazy("efo.cli.service:dev_command", "The local AWS stack: up, env, stream, put, down."),
}


@click.group(
    cls=Group,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=examples(
        "efo consumers list --stream orders --app billing",
        "efo shards --stream orders --app billing",
        "efo workers --stream orders --app billing",
        "efo checkpoints reset --stream orders --app billing --all --to LATEST --wait",
    )
    + "\n\nEvery operator command takes --stream, --app and --config (flags win over EFO_* variables, "
    "which win over the file) and --json. With several streams configured (streams), the listings cover "
    "each of them and --stream selects one. Exit codes: 0 ok, 1 failed, 2 usage, 3 not found, "
    "75 a bounded run (efo run --until) stopped before its end. "
    "Older names still work: 'efo consumer ...' and 'efo leases'.",
)
@click.version_option(__version__, prog_name="efo")
def cli() -> None:
    """Kinesis Enhanced Fan-Out to PySpark DataFrames: run the service, and operate it."""


cli.aliases["consumer"] = COMMANDS["consumers"]
cli.aliases["leases"] = Lazy("efo.cli.checkpoints:show_command")


def main(argv: list[str] | None = None) -> int:
    """Run one command; every error ends as one line on standard error and its exit code."""
    try:
        result = cli.main(args=argv, prog_name="efo", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.format_message(), err=True)
        return EXIT_CONFIG
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "efo"
        click.echo(f"efo: {exc.format_message().rstrip('.')}; see '{where} --help'", err=True)
        return EXIT_CONFIG
    except EfoError as exc:
        click.echo(f"efo: {exc}", err=True)
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("efo: interrupted", err=True)
        return EXIT_RUNTIME
    return int(result or 0)
