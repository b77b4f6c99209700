"""``efo consumers list|describe|register|deregister``: a stream's Enhanced Fan-Out consumers, who
reads through each, and retiring one safely (``efo consumer`` and ``consumer show`` still work).

Who reads through a consumer: the workers, of any application, whose heartbeat row in the given
lease table(s) names the consumer and is younger than ``lease.failover_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from efo.cli.common import (
    STREAM_COLUMN,
    Column,
    Connection,
    Scope,
    confirm,
    for_each_stream,
    iso,
    json_option,
    now,
    print_json,
    print_table,
    refuse_without_terminal,
    say,
    scoped,
    scoped_streams,
    shown,
    streams_text,
    wait_s_option,
    wait_until,
    with_stream,
)
from efo.cli.group import Group, examples
from efo.cli.status import duration, heartbeat_age_s, is_live
from efo.errors import EXIT_OK, ConfigError, EfoError, ResourceNotFound
from efo.kinesis.registration import (
    deregister_consumer,
    describe_consumer,
    list_consumers,
    register_consumer,
)
from efo.leases.admin import table_workers

DEFAULT_WAIT_S = 120.0
TABLES_HINT = "check --table, --app and EFO_TABLE: each names a lease table that efo run has created"


class ConsumerInUse(EfoError):
    """A live worker reads through the consumer an operator asked to deregister."""


@click.group(
    cls=Group,
    short_help="List, describe, register and retire EFO consumers.",
    epilog=examples(
        "efo consumers list --stream orders --app billing",
        "efo consumers register --stream orders --name billing --wait",
        "efo consumers deregister --stream orders --name old-billing --app billing",
    ),
)
def consumers() -> None:
    """A stream's Enhanced Fan-Out consumers: who reads through each, register, retire safely.

    Every registered consumer is billed per shard-hour, read or not: retire the ones no live
    worker uses with 'efo consumers deregister'.
    """


def tables_option(command: Any) -> Any:
    return click.option(
        "--table",
        "tables",
        multiple=True,
        metavar="NAME",
        help="Lease table whose workers (of any application) are looked for; repeatable. "
        "Default: EFO_TABLE, else the application's.",
    )(command)


def consumer_options(command: Any) -> Any:
    command = click.option("--arn", metavar="ARN", help="The consumer's ARN.")(command)
    return click.option("--name", metavar="NAME", help="The consumer's name (default: EFO_CONSUMER_NAME, else --app).")(
        command
    )


@dataclass(frozen=True, slots=True)
class Reader:
    """A live worker whose heartbeat says it reads through a consumer."""

    table: str
    app: str
    worker_id: str
    heartbeat_age_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "app": self.app,
            "worker_id": self.worker_id,
            "heartbeat_age_s": round(self.heartbeat_age_s, 3),
        }

    def __str__(self) -> str:
        return f"{self.app}/{self.worker_id}"


async def live_readers(conn: Connection, tables: Sequence[str], *, any_age: bool = False) -> dict[str, list[Reader]]:
    """Live workers by the ARN of the consumer they read through, from every application in ``tables``;
    with ``any_age``, every worker whose heartbeat row names it, however old (a worker that stops
    cleanly removes its row; an old one may be dead, or its clock behind, or its failover longer)."""
    dynamodb = await conn.clients.dynamodb()
    moment = now()
    failover_s = conn.scope.settings.lease.failover_s
    known = ((conn.scope.app, conn.stream.arn),) if conn.scope.app else ()
    readers: dict[str, list[Reader]] = {}
    for table in tables:
        for worker in await table_workers(dynamodb, table, known=known, hint=TABLES_HINT):
            row = worker.row
            if row.consumer_arn and (any_age or is_live(row, moment, failover_s)):
                age = heartbeat_age_s(row, moment) or 0.0
                readers.setdefault(row.consumer_arn, []).append(Reader(table, worker.app, row.worker_id, age))
    return readers


def consumer_fields(description: dict[str, Any]) -> dict[str, Any]:
    """A consumer's ``--json`` fields as Kinesis describes it."""
    return {
        "name": description["ConsumerName"],
        "arn": description["ConsumerARN"],
        "status": description["ConsumerStatus"],
        "created_at": iso(description.get("ConsumerCreationTimestamp")),
    }


def consumer_record(stream: str, description: dict[str, Any], readers: list[Reader] | None) -> dict[str, Any]:
    """The ``--json`` shape of a consumer of ``stream`` (its name) in ``list`` and ``describe``
    (``in_use`` and ``readers`` are null when no lease table was given)."""
    return {
        "stream": stream,
        **consumer_fields(description),
        "in_use": None if readers is None else bool(readers),
        "readers": None if readers is None else [reader.to_json() for reader in readers],
    }


def _in_use_text(record: dict[str, Any]) -> str:
    if record["in_use"] is None:
        return "?"
    if not record["in_use"]:
        return "no"
    return "yes: " + ", ".join(f"{r['app']}/{r['worker_id']}" for r in record["readers"])


def _status_style(record: dict[str, Any]) -> str:
    return {"ACTIVE": "green", "CREATING": "yellow", "DELETING": "red"}.get(record["status"], "")


CONSUMER_COLUMNS = (
    STREAM_COLUMN,
    Column("name", lambda r: r["name"]),
    Column("status", lambda r: r["status"], _status_style),
    Column("created", lambda r: shown(r["created_at"])),
    Column("in use", _in_use_text, lambda r: "bold" if r["in_use"] else ""),
    Column("arn", lambda r: r["arn"]),
)


UNKNOWN_READERS = "IN USE '?': who reads through it is unknown; name the lease table(s) with --table or --app"


@consumers.command(
    "list",
    short_help="Every consumer, and who reads through it.",
    epilog=examples(
        "efo consumers list --stream orders --app billing",
        "efo consumers list --config efo.yaml --app billing",
        "efo consumers list --stream orders --table billing --table fraud --json",
    ),
)
@scoped_streams(need_app=False)
@tables_option
@json_option
def list_command(scopes: list[Scope], tables: tuple[str, ...], as_json: bool) -> int:
    """Every consumer of every configured stream (or of the one --stream names): name, status,
    creation time, and whether a live worker uses it."""

    async def body(conn: Connection) -> list[dict[str, Any]]:
        described = await list_consumers(conn.kinesis, conn.stream.arn)
        return await with_readers(conn, sorted(described, key=lambda d: str(d["ConsumerName"])), tables)

    covered = for_each_stream(scopes, body)
    records = [record for records in covered.results for record in records]
    if as_json:
        print_json(records)
    elif records or not covered.missing:
        print_consumer_table(records, empty=f"no consumers are registered on {streams_text(scopes)}")
    return covered.report_missing()


async def with_readers(
    conn: Connection, descriptions: list[dict[str, Any]], tables: Sequence[str]
) -> list[dict[str, Any]]:
    """The ``list`` and ``describe`` records of the consumers, with the live workers reading through
    each, from ``--table`` or else the settings' lease table (unknown with neither)."""
    searched = searched_tables(conn.scope, tables)
    readers = await live_readers(conn, searched) if searched else None
    return [
        consumer_record(conn.stream.name, d, None if readers is None else readers.get(d["ConsumerARN"], []))
        for d in descriptions
    ]


def searched_tables(scope: Scope, tables: Sequence[str]) -> list[str]:
    """The lease tables to look for readers in: ``--table``, else the settings' table, else none."""
    return list(tables) or ([scope.table] if scope.table else [])


def print_consumer_table(records: list[dict[str, Any]], *, empty: str) -> None:
    print_table(records, CONSUMER_COLUMNS, empty=empty)
    if any(record["in_use"] is None for record in records):
        click.echo(UNKNOWN_READERS, err=True)


async def _find(conn: Connection, name: str | None, arn: str | None) -> dict[str, Any]:
    """The described consumer named by --name/--arn, else by the settings; exit 3 when not registered."""
    if name and arn:
        raise ConfigError("--name and --arn name the same consumer: pass one of them")
    scope = conn.scope
    if not name and not arn:
        arn = scope.settings.consumer_arn
        name = None if arn else scope.consumer_name
    if not name and not arn:
        raise ConfigError("no consumer given: pass --name NAME or --arn ARN (or --app, the default name)")
    description = await describe_consumer(conn.kinesis, stream_arn=conn.stream.arn, name=name, arn=arn)
    if description is None:
        raise ResourceNotFound(
            f"consumer {arn or name!r} is not registered on stream {conn.stream.name!r}; "
            f"see 'efo consumers list --stream {conn.stream.name}'"
        )
    return description


@consumers.command(
    "describe",
    short_help="One consumer, and who reads through it.",
    epilog=examples(
        "efo consumers describe --stream orders --name billing",
        "efo consumers describe --stream orders --arn arn:aws:kinesis:...:stream/orders/consumer/billing:1 --json",
    ),
)
@scoped(need_app=False)
@consumer_options
@tables_option
@json_option
def describe_command(scope: Scope, name: str | None, arn: str | None, tables: tuple[str, ...], as_json: bool) -> int:
    """One consumer: ARN, status, creation time, and the live workers reading through it."""

    async def body(conn: Connection) -> dict[str, Any]:
        [record] = await with_readers(conn, [await _find(conn, name, arn)], tables)
        return record

    record = with_stream(scope, body)
    if as_json:
        print_json(record)
    else:
        print_consumer_table([record], empty="")
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class Registration:
    description: dict[str, Any]
    registered: bool  # by this command (False: it was registered already)
    waited_s: float | None  # until ACTIVE, with --wait
    open_shards: int


@consumers.command(
    "register",
    short_help="Register a consumer (idempotent).",
    epilog=examples(
        "efo consumers register --stream orders --name billing --wait",
        "efo consumers register --stream orders --app billing --json",
    ),
)
@scoped(need_app=False)
@click.option("--name", metavar="NAME", help="The consumer's name (default: EFO_CONSUMER_NAME, else --app).")
@click.option("--wait", is_flag=True, help="Wait until it is ACTIVE (showing progress).")
@wait_s_option(DEFAULT_WAIT_S)
@json_option
def register_command(scope: Scope, name: str | None, wait: bool, wait_s: float, as_json: bool) -> int:
    """Register a consumer; nothing happens when it exists already (it is reported as it is).

    Kinesis allows 20 consumers per stream and 5 CREATING at once per account: past that, the
    error says so. Each consumer is billed per shard-hour until it is deregistered.
    """
    consumer = name or scope.consumer_name
    if not consumer:
        raise ConfigError("no consumer name given: pass --name NAME (or --app, the default name)")

    async def body(conn: Connection) -> Registration:
        found = await describe_consumer(conn.kinesis, stream_arn=conn.stream.arn, name=consumer)
        created = None if found else await register_consumer(conn.kinesis, conn.stream.arn, consumer)
        registered = created is not None
        # None from both: another worker or operator registered it a moment ago
        description = found or created or await _find(conn, consumer, None)
        if description["ConsumerStatus"] == "DELETING":
            raise EfoError(
                f"consumer {consumer!r} of stream {conn.stream.name!r} is being deleted; register it again once "
                f"'efo consumers describe --name {consumer}' says it is not registered"
            )
        if not wait or description["ConsumerStatus"] == "ACTIVE":
            return Registration(description, registered, None, conn.stream.open_shards)
        latest = description

        async def active() -> tuple[bool, str]:
            nonlocal latest
            latest = await _find(conn, None, str(description["ConsumerARN"]))
            return latest["ConsumerStatus"] == "ACTIVE", f"consumer {consumer!r} is {latest['ConsumerStatus']}"

        done, waited_s = await wait_until(
            active, message=f"waiting for consumer {consumer!r} to become ACTIVE", timeout_s=wait_s
        )
        if not done:
            raise EfoError(
                f"consumer {consumer!r} is still {latest['ConsumerStatus']} after {waited_s:.0f} s; "
                f"see 'efo consumers describe --name {consumer}'"
            )
        return Registration(latest, registered, waited_s, conn.stream.open_shards)

    done = with_stream(scope, body)
    record = {**consumer_fields(done.description), "registered": done.registered}
    if as_json:
        print_json(record)
        return EXIT_OK
    what = "registered" if done.registered else "already registered:"
    after = f" after {done.waited_s:.1f} s" if done.waited_s is not None else ""
    say(f"{what} consumer {consumer!r} on stream {scope.stream!r}, {record['status']}{after}")
    say(f"arn: {record['arn']}")
    if done.registered:
        say(
            f"it is billed per shard-hour ({done.open_shards} open shards) until "
            f"'efo consumers deregister --name {consumer}'"
        )
    return EXIT_OK


@consumers.command(
    "deregister",
    short_help="Deregister a consumer no live worker uses.",
    epilog=examples(
        "efo consumers deregister --stream orders --name billing --app billing",
        "efo consumers deregister --stream orders --arn ARN --table billing --yes --json",
    ),
)
@scoped(need_app=False)
@consumer_options
@tables_option
@click.option("--yes", is_flag=True, help="Do not ask (scripts); without a terminal it is required.")
@click.option("--force", is_flag=True, help="Deregister even while live workers read through it (they stop).")
@wait_s_option(DEFAULT_WAIT_S)
@json_option
def deregister_command(
    scope: Scope,
    name: str | None,
    arn: str | None,
    tables: tuple[str, ...],
    yes: bool,
    force: bool,
    wait_s: float,
    as_json: bool,
) -> int:
    """Deregister a consumer and wait until it is gone.

    Refused while a live worker of any application in the lease table(s) reads through it (every
    such worker stops), unless --force. Asks first on a terminal; --yes for scripts.
    """
    refuse_without_terminal("deregister a consumer", yes=yes)
    searched = searched_tables(scope, tables)
    if not searched and not force:
        raise ConfigError(
            "cannot tell whether a live worker reads through the consumer: name the lease table(s) with "
            "--table or --app, or pass --force"
        )

    async def body(conn: Connection) -> tuple[dict[str, Any], list[Reader] | None, float]:
        description = await _find(conn, name, arn)
        consumer_arn = str(description["ConsumerARN"])
        label = f"consumer {description['ConsumerName']!r}"

        async def check_readers() -> list[Reader] | None:
            # Every heartbeat row naming it, however old: liveness by age depends on the workers'
            # clocks and failover settings; a worker that stops cleanly removes its row.
            readers = (await live_readers(conn, searched, any_age=True)).get(consumer_arn, []) if searched else None
            if readers and not force:
                raise ConsumerInUse(
                    f"{label} is named by the heartbeat of {len(readers)} worker(s): "
                    + ", ".join(f"{r} (heartbeat {duration(r.heartbeat_age_s)} ago)" for r in readers)
                    + "; stop them first (a clean stop removes the row), or pass --force if they are gone "
                    "(running ones fail and stop)"
                )
            return readers

        readers = await check_readers()
        warning = f" {len(readers)} worker(s) read through it and will stop." if readers else ""
        confirm(f"Deregister {label} ({consumer_arn}) from stream {conn.stream.name!r}?{warning}", yes=yes)
        readers = await check_readers()  # again: a worker may have started while the question was open
        await deregister_consumer(conn.kinesis, consumer_arn)
        status = "DELETING"

        async def gone() -> tuple[bool, str]:
            nonlocal status
            current = await describe_consumer(conn.kinesis, stream_arn=conn.stream.arn, arn=consumer_arn)
            status = "gone" if current is None else str(current["ConsumerStatus"])
            return current is None, f"{label} is {status}"

        done, waited_s = await wait_until(gone, message=f"waiting for {label} to be deleted", timeout_s=wait_s)
        if not done:
            raise EfoError(f"{label} is still {status} after {waited_s:.0f} s; see 'efo consumers list'")
        return description, readers, waited_s

    description, readers, waited_s = with_stream(scope, body)
    record = {
        "name": description["ConsumerName"],
        "arn": description["ConsumerARN"],
        "deregistered": True,
        "forced": force,
        "readers": None if readers is None else [reader.to_json() for reader in readers],
    }
    if as_json:
        print_json(record)
        return EXIT_OK
    if readers is None:
        checked = "its readers were not checked (--force without a lease table)"
    elif readers:
        checked = f"{len(readers)} live worker(s) read through it (--force): " + ", ".join(map(str, readers))
    else:
        checked = f"no worker read through it (lease tables checked: {', '.join(searched_tables(scope, tables))})"
    say(f"deregistered consumer {record['name']!r} from stream {scope.stream!r} in {waited_s:.1f} s; {checked}")
    say(f"arn: {record['arn']}")
    return EXIT_OK


consumers.aliases["show"] = describe_command
