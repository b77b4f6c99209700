"""``efo doctor``: check, from where the pod runs, everything a deployment needs (efo/doctor/)."""

from __future__ import annotations

import click

from efo.cli.common import (
    Column,
    json_option,
    load_for_stream,
    operator_logging,
    print_json,
    print_table,
    settings_options,
)
from efo.cli.configuration import settings_records
from efo.cli.group import examples
from efo.doctor import diagnose

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}

COLUMNS = (
    Column("check", lambda r: r["check"]),
    Column("resource", lambda r: r["resource"]),
    Column("result", lambda r: r["status"], lambda r: STATUS_STYLE.get(r["status"], "")),
    Column("detail", lambda r: r["detail"]),
)


@click.command(
    "doctor",
    short_help="Check everything a deployment needs, before it runs.",
    epilog=examples(
        "efo doctor --config efo.yaml",
        "efo doctor --config efo.yaml --workers 4 --json",
        "kubectl logs job/orders-efo-doctor   # helm test orders: the chart's Job runs it in the pod's place",
    ),
)
@settings_options
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Workers (pods) that will read the streams: the shards each holds, against the pool and the table.",
)
@click.option("--no-write", is_flag=True, help="Do not write (and delete) a test file under the sink's path.")
@json_option
def doctor_command(
    config: str | None, stream: str | None, app: str | None, workers: int, no_write: bool, as_json: bool
) -> int:
    """Check what a deployment needs, from where it will run, and say what to do about each: the
    settings; credentials and region; every Kinesis and DynamoDB action efo calls, on its resource,
    by a harmless call of each; each stream (status, shards against the workers and the pool,
    encryption, retention against the checkpoints' age) and its consumer (registered, ACTIVE, room
    for one more); the lease table (keys, capacity, layout, lease partitions); the sinks (module,
    file system, a test write and delete). Changes nothing but its own temporary objects (deleted
    again). Exit 0 when no check fails (warnings allowed), 1 when one does."""
    settings = load_for_stream(config, stream, flags={"app": app})
    records = settings_records(config, stream, app)
    operator_logging()
    report = diagnose(settings, records, workers=workers, write=not no_write)
    if as_json:
        print_json(report.to_json())
    else:
        print_table([f.to_json() for f in report.findings], COLUMNS, empty="no checks ran")
    failed = report.failed
    if failed:
        names = ", ".join(f"{f.check} on {f.resource}" for f in failed[:3]) + (", ..." if len(failed) > 3 else "")
        click.echo(
            f"efo: {len(failed)} of {len(report.findings)} checks failed ({names}): see what to do above", err=True
        )
    return report.exit_code
