"""``efo checkpoints show|reset``: where each shard of the application resumes, and moving it while
workers run (``efo leases`` still works, for ``show``).

A reset is written on each shard's lease as pending; the worker that owns the shard applies it
within a lease cycle by restarting the shard at the new position (no process restart). With no
worker running it applies at the next start.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from efo.cli.common import (
    STREAM_COLUMN,
    Column,
    Connection,
    Scope,
    confirm,
    for_each_stream,
    json_option,
    live_workers,
    now,
    print_json,
    print_table,
    refuse_without_terminal,
    say,
    scoped,
    scoped_streams,
    wait_s_option,
    wait_until,
    with_stream,
)
from efo.cli.group import Group, examples
from efo.cli.status import LEASE_STYLES, duration, lag_text, lease_record
from efo.config import InitialPosition
from efo.errors import EXIT_OK, EXIT_RUNTIME, ConfigError, EfoError, ResourceNotFound
from efo.kinesis.shards import list_shards
from efo.leases import admin
from efo.leases.model import TableState
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position, after

DEFAULT_WAIT_S = 60.0


@click.group(
    cls=Group,
    short_help="Show checkpoints, and move them while running.",
    epilog=examples(
        "efo checkpoints show --stream orders --app billing",
        "efo checkpoints reset --stream orders --app billing --all --to TRIM_HORIZON --wait",
    ),
)
def checkpoints() -> None:
    """Where each shard of the application resumes; move it while workers run."""


def checkpoint_records(stream: str, state: TableState, scope: Scope) -> list[dict[str, Any]]:
    """The ``--json`` shape of ``checkpoints show`` for one stream (its name), by shard id."""
    live = live_workers(state, scope)
    return [
        {"stream": stream, "shard_id": lease.shard_id, "parents": list(lease.parents), "counter": lease.counter}
        | lease_record(lease, live)
        for lease in sorted(state.leases.values(), key=lambda lease: lease.shard_id)
    ]


def _age(text: str | None) -> str:
    if text is None:
        return ""
    return duration((now() - datetime.fromisoformat(text)).total_seconds()) + " ago"


CHECKPOINT_COLUMNS = (
    STREAM_COLUMN,
    Column("shard", lambda r: r["shard_id"]),
    Column("owner", lambda r: r["owner"] or ""),
    Column("lease", lambda r: r["lease_state"], lambda r: LEASE_STYLES.get(r["lease_state"], "")),
    Column("counter", lambda r: str(r["counter"])),
    Column("checkpoint", lambda r: r["checkpoint"]),
    Column("written", lambda r: _age(r["checkpointed_at"])),
    Column("lag", lag_text),
    Column("reset pending", lambda r: r["reset_pending"] or ""),
)


@checkpoints.command(
    "show",
    short_help="Each shard's owner, checkpoint, lag, pending reset.",
    epilog=examples(
        "efo checkpoints show --app billing --config efo.yaml",
        "efo checkpoints show --stream orders --app billing",
        "efo leases --stream orders --app billing",
    ),
)
@scoped_streams(need_app=True)
@json_option
def show_command(scopes: list[Scope], as_json: bool) -> int:
    """Each shard's lease: owner, lease state, counter, checkpoint, when it was written, lag, and
    any reset not yet applied; of every configured stream, or of the one --stream names."""

    async def body(conn: Connection) -> list[dict[str, Any]]:
        return checkpoint_records(conn.stream.name, await conn.table_state(), conn.scope)

    covered = for_each_stream(scopes, body)
    records = [record for records in covered.results for record in records]
    if as_json:
        print_json(records)
    elif records or not covered.missing:
        print_table(records, CHECKPOINT_COLUMNS, empty=f"application {scopes[0].app!r} has no leases yet")
    return covered.report_missing()


def reset_position(text: str) -> Position:
    """``--to``: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601> or AFTER:<sequence number>."""
    value = text.strip()
    if value.upper().startswith("AFTER:"):
        sequence = value.split(":", 1)[1].strip()
        if not sequence.isdigit():
            raise ConfigError(f"--to {text!r}: AFTER needs a sequence number (digits), e.g. AFTER:4959...")
        return after(sequence)
    try:
        initial = InitialPosition.parse(value)
    except ValueError as exc:
        raise ConfigError(f"--to {text!r}: {exc}, AFTER:<sequence number>") from None
    if initial.kind == "LATEST":  # from now: the moment of the request, whenever its owner applies it
        return Position("AT_TIMESTAMP", timestamp=datetime.now(UTC))
    return Position(initial.kind, timestamp=initial.timestamp)


@checkpoints.command(
    "reset",
    short_help="Move checkpoints (--shard or --all) while running.",
    epilog=examples(
        "efo checkpoints reset --stream orders --app billing --all --to LATEST --wait",
        "efo checkpoints reset --app billing --shard shardId-000000000001 --to AFTER:4960... --yes",
        "efo checkpoints reset --app billing --all --to AT_TIMESTAMP:2026-11-23T12:00:00Z --yes --json",
        "efo checkpoints reset --app billing --delete-all --yes",
    ),
)
@scoped(need_app=True)
@click.option("--shard", "shard_ids", multiple=True, metavar="ID", help="A shard to reset (repeatable).")
@click.option("--all", "all_shards", is_flag=True, help="Every shard of the application.")
@click.option("--delete-all", is_flag=True, help="Delete every lease and checkpoint (a stream deleted and recreated).")
@click.option(
    "--to", "to", metavar="POSITION", help="LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601> or AFTER:<sequence>."
)
@click.option("--yes", is_flag=True, help="Do not ask (scripts); without a terminal it is required.")
@click.option("--force", is_flag=True, help="--delete-all even though workers' heartbeat rows are there.")
@click.option("--wait", is_flag=True, help="Wait until every owner has applied it.")
@wait_s_option(DEFAULT_WAIT_S)
@json_option
def reset_command(
    scope: Scope,
    shard_ids: tuple[str, ...],
    all_shards: bool,
    delete_all: bool,
    to: str | None,
    yes: bool,
    force: bool,
    wait: bool,
    wait_s: float,
    as_json: bool,
) -> int:
    """Move checkpoints while running: each owner restarts those shards at the new position within
    a lease cycle; with no worker running, the next start does. --delete-all removes every lease."""
    if sum((bool(shard_ids), all_shards, delete_all)) != 1:
        raise ConfigError("checkpoints reset needs one of --shard ID, --all or --delete-all")
    if delete_all:
        if to or wait:
            raise ConfigError("--delete-all takes neither --to nor --wait: the next start applies EFO_INITIAL_POSITION")
        return _delete_all(scope, yes=yes, force=force, as_json=as_json)
    if not to:
        raise ConfigError(
            "checkpoints reset needs --to POSITION: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>, AFTER:<seq>"
        )
    position = reset_position(to)
    if position.kind == "AFTER_SEQUENCE_NUMBER" and all_shards:
        raise ConfigError("--to AFTER:<sequence> names a record of one shard: use it with --shard, not --all")
    refuse_without_terminal("reset checkpoints", yes=yes)

    async def body(conn: Connection) -> dict[str, Any]:
        table = await conn.lease_table()
        state = await table.read()
        shards = sorted(state.leases) if all_shards else list(shard_ids)
        missing = [shard for shard in shards if shard not in state.leases]
        # Finished shards whose leases were deleted (efo.leases.cleanup) but are still in the stream:
        # --all means them too, and --shard names them, so they get a lease at the position, written
        # before the resets; their children (whose owners read their parents' rows again before
        # applying one) wait for them.
        graph = await list_shards(conn.kinesis, conn.stream.arn) if all_shards or missing else None
        unknown = [shard for shard in missing if graph is None or shard not in graph.shards]
        if unknown or not shards:
            raise ResourceNotFound(
                f"no lease for shard(s) {', '.join(unknown) or '(any)'} of application {scope.app!r}, and "
                f"stream {conn.stream.name!r} does not list them (past its retention, or never one of its "
                "shards); see 'efo checkpoints show' and 'efo shards'"
            )
        shards = [shard for shard in shards if shard in state.leases]
        owners = {state.leases[shard].owner for shard in shards} - {None}
        # Parents first: a child's lease written before its parent's (the command dying in between)
        # would hide the parent from the lister for ever (ShardGraph.needing_leases).
        wanted = set(graph.shards) if all_shards and graph is not None else set(missing)
        unleased = [] if graph is None else graph.parents_first(wanted - set(state.leases))
        confirm(
            f"Reset {len(shards) + len(unleased)} shard(s) of application {scope.app!r} on stream "
            f"{conn.stream.name!r} to {position}? {len(owners)} worker(s) hold them and restart them there.",
            yes=yes,
        )
        async with table.changing():
            for shard_id in unleased:
                assert graph is not None
                await table.create_lease(shard_id, graph.shards[shard_id].parents, position)
        shards = [*shards, *unleased]
        # A finished lease read above may be deleted by the lister before its reset is written (the
        # more likely the longer the confirmation took): written again at the position, as above.
        parents = None if graph is None else {shard_id: shard.parents for shard_id, shard in graph.shards.items()}
        reset_id = await table.request_reset(shards, position, recreate=parents)
        record: dict[str, Any] = {
            "reset_id": reset_id,
            "position": str(position),
            "shard_ids": shards,
            "stream": conn.stream.name,
        }
        if not as_json:
            applies = "their owners apply it within a lease cycle" if owners else "it applies at the next start"
            say(f"reset of {len(shards)} shard(s) to {position} requested (id {reset_id}); {applies}")
        record["applied"] = await _wait_applied(table, reset_id, wait_s) if wait else None
        return record

    record = with_stream(scope, body)
    if as_json:
        print_json(record)
    elif record["applied"]:
        say(f"applied to {len(record['shard_ids'])} shard(s)")
    if record["applied"] is False:
        click.echo(f"efo: not applied within {wait_s:g} s (is a worker running?); see 'efo checkpoints show'", err=True)
        return EXIT_RUNTIME
    return EXIT_OK


async def _wait_applied(table: LeaseTable, reset_id: str, wait_s: float) -> bool:
    async def applied() -> tuple[bool, str]:
        pending = [
            shard_id
            for shard_id, lease in (await table.read()).leases.items()
            if lease.reset and lease.reset.reset_id == reset_id
        ]
        return not pending, f"waiting for {len(pending)} shard(s) to apply the reset"

    done, _ = await wait_until(applied, message="waiting for the owners to apply the reset", timeout_s=wait_s)
    return done


async def _refuse_while_running(table: LeaseTable, scope: Scope, force: bool, why: str) -> None:
    """Unless ``force``: refuse while any worker of the application has a heartbeat row (a clean
    stop removes it). Reads no lease, so a table of an older layout is no obstacle."""
    running = sorted((await table.read_control()).workers)
    if running and not force:
        raise EfoError(
            f"worker(s) {', '.join(running)} of application {scope.app!r} have heartbeat rows in table "
            f"{table.table!r}: stop them first ({why}), or pass --force if they are gone"
        )


def _delete_all(scope: Scope, *, yes: bool, force: bool, as_json: bool) -> int:
    refuse_without_terminal("delete every lease and checkpoint", yes=yes)

    async def body(conn: Connection) -> dict[str, Any]:
        table = await conn.lease_table()
        await _refuse_while_running(table, scope, force, "deleting under running workers makes them re-read the stream")
        confirm(
            f"Delete every lease and checkpoint of application {scope.app!r} on stream {conn.stream.name!r} "
            f"from table {table.table!r}? The next start applies EFO_INITIAL_POSITION.",
            yes=yes,
        )
        removed = await admin.delete_all(table)
        return {"deleted_rows": removed, "table": table.table, "app": scope.app, "stream": conn.stream.name}

    record = with_stream(scope, body)
    if as_json:
        print_json(record)
    else:
        say(
            f"removed {record['deleted_rows']} rows of application {scope.app!r} on stream "
            f"{record['stream']!r} from table {record['table']!r}"
        )
    return EXIT_OK


@checkpoints.command(
    "migrate",
    short_help="Move leases of an older table layout to lease partitions.",
    epilog=examples("efo checkpoints migrate --stream orders --app billing --yes"),
)
@scoped(need_app=True)
@click.option("--yes", is_flag=True, help="Do not ask (scripts); without a terminal it is required.")
@click.option("--force", is_flag=True, help="Migrate even though workers' heartbeat rows are there.")
@json_option
def migrate_command(scope: Scope, yes: bool, force: bool, as_json: bool) -> int:
    """Move the application's leases from the table layout of efo before lease partitions (every row
    under one partition key) to lease partitions, checkpoints untouched. Stop every worker of the
    application first; running it again after an interruption completes it."""
    refuse_without_terminal("migrate the lease table", yes=yes)

    async def body(conn: Connection) -> dict[str, Any]:
        table = await conn.lease_table()
        await _refuse_while_running(table, scope, force, "they would keep writing where the leases were")
        confirm(
            f"Move the leases of application {scope.app!r} on stream {conn.stream.name!r} in table "
            f"{table.table!r} to lease partitions?",
            yes=yes,
        )
        moved = await admin.migrate(table)
        return {
            "moved_leases": moved,
            "lease_partitions": table.lease_partitions,
            "table": table.table,
            "app": scope.app,
            "stream": conn.stream.name,
        }

    record = with_stream(scope, body)
    if as_json:
        print_json(record)
    elif record["moved_leases"]:
        say(
            f"moved {record['moved_leases']} lease(s) of application {scope.app!r} on stream {record['stream']!r} "
            f"to {record['lease_partitions']} lease partitions of table {record['table']!r}"
        )
    else:
        say(f"nothing to move: application {scope.app!r} already uses lease partitions")
    return EXIT_OK
