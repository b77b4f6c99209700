"""The ``efo`` command: run the service, check configuration, operate consumers, shards and leases.

Exit codes for every command: 0 success, 1 runtime failure, 2 usage or configuration error,
3 a named resource not found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from efo.aws import Clients, Endpoints
from efo.config import InitialPosition, Settings, load_settings, settings_table
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME, ConfigError, EfoError, ResourceNotFound
from efo.kinesis.registration import describe_consumer, describe_stream, ensure_consumer
from efo.kinesis.shards import list_shards
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position, after


def _settings(args: argparse.Namespace, *, need_sink: bool = True) -> Settings:
    return load_settings(args.config, defaults=None if need_sink else {"sink": "console"})


def _cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from sparkbridge.app import run  # lazily: efo itself never imports pyspark

    return run(settings)


def _cmd_config_validate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(f"configuration is valid: stream={settings.stream} app={settings.app} sink={settings.sink}")
    return EXIT_OK


def _cmd_config_show(args: argparse.Namespace) -> int:
    settings = _settings(args, need_sink=False)
    print(json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True))
    return EXIT_OK


def _cmd_config_table(args: argparse.Namespace) -> int:
    print(settings_table())
    return EXIT_OK


def _aws(
    body: Callable[[Settings, Clients, Any, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    """Wrap an operator command: settings, clients, the stream, then ``body(settings, clients, stream, args)``."""

    def handler(args: argparse.Namespace) -> int:
        settings = _settings(args, need_sink=False)

        async def main() -> int:
            endpoints = Endpoints(settings.region, settings.kinesis_endpoint, settings.dynamodb_endpoint)
            async with Clients(endpoints) as clients:
                stream = await describe_stream(await clients.kinesis(), settings.stream)
                return await body(settings, clients, stream, args)

        return asyncio.run(main())

    return handler


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        print("(none)")
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


async def _consumer_show(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    kinesis = await clients.kinesis()
    description = await describe_consumer(
        kinesis,
        stream_arn=stream.arn,
        name=None if settings.consumer_arn else settings.consumer,
        arn=settings.consumer_arn,
    )
    if description is None:
        raise ResourceNotFound(f"consumer {settings.consumer!r} is not registered on stream {stream.name!r}")
    _print(
        [
            {
                k: description.get(k)
                for k in ("ConsumerName", "ConsumerARN", "ConsumerStatus", "ConsumerCreationTimestamp")
            }
        ],
        args.json,
    )
    return EXIT_OK


async def _consumer_register(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    arn = await ensure_consumer(await clients.kinesis(), stream_arn=stream.arn, name=settings.consumer)
    print(arn)
    return EXIT_OK


async def _consumer_deregister(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    if not args.yes:
        print("refusing to deregister without --yes: every worker of this application stops reading", file=sys.stderr)
        return EXIT_CONFIG
    kinesis = await clients.kinesis()
    description = await describe_consumer(
        kinesis, stream_arn=stream.arn, name=settings.consumer, arn=settings.consumer_arn
    )
    if description is None:
        raise ResourceNotFound(f"consumer {settings.consumer!r} is not registered on stream {stream.name!r}")
    await kinesis.deregister_stream_consumer(ConsumerARN=description["ConsumerARN"])
    print(f"deregistering {description['ConsumerARN']}")
    return EXIT_OK


async def _shards(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    graph = await list_shards(await clients.kinesis(), stream.arn)
    rows = [
        {
            "shard_id": sid,
            "parents": ",".join(s.parents),
            "state": "closed" if graph.is_closed(sid) else "open",
            "children": ",".join(graph.children(sid)),
        }
        for sid, s in sorted(graph.shards.items())
    ]
    _print(rows, args.json)
    return EXIT_OK


def _table(settings: Settings, clients_ddb: Any, stream: Any) -> LeaseTable:
    return LeaseTable(
        clients_ddb, table=settings.table_name, app=settings.app, stream_arn=stream.arn, worker_id="efo-cli"
    )


async def _leases(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    table = _table(settings, await clients.dynamodb(), stream)
    await table.ensure_table(create=False)
    state = await table.read()
    rows = [
        {
            "shard_id": lease.shard_id,
            "owner": lease.owner or "",
            "counter": lease.counter,
            "checkpoint": "SHARD_END" if lease.finished else str(lease.checkpoint),
            "parents": ",".join(lease.parents),
        }
        for lease in sorted(state.leases.values(), key=lambda lease: lease.shard_id)
    ]
    _print(rows, args.json)
    return EXIT_OK


def _reset_position(text: str) -> Position:
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


async def _checkpoints_reset(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    table = _table(settings, await clients.dynamodb(), stream)
    await table.ensure_table(create=False)
    if args.delete_all:
        if not args.yes:
            print(
                "refusing to delete every lease without --yes: the next start applies EFO_INITIAL_POSITION",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        removed = await table.delete_all()
        print(f"removed {removed} rows of application {settings.app!r} on stream {stream.name!r}", end="")
        print(f" from table {table.table!r}")
        return EXIT_OK
    if not args.to or not (args.shard or args.all):
        print("efo: checkpoints reset needs --to and one of --shard ID or --all (or --delete-all)", file=sys.stderr)
        return EXIT_CONFIG
    position = _reset_position(args.to)
    if position.kind == "AFTER_SEQUENCE_NUMBER" and args.all:
        raise ConfigError("--to AFTER:<sequence> names a record of one shard: use it with --shard, not --all")
    state = await table.read()
    shards = sorted(state.leases) if args.all else args.shard
    missing = [shard for shard in shards if shard not in state.leases]
    if missing:
        raise ResourceNotFound(
            f"no lease for shard(s) {', '.join(missing)} of application {settings.app!r}; see 'efo leases'"
        )
    if not args.yes:
        print(f"refusing to reset {len(shards)} shard(s) to {position} without --yes", file=sys.stderr)
        return EXIT_CONFIG
    reset_id = await table.request_reset(shards, position)
    live = {lease.owner for lease in state.leases.values() if lease.owner}
    print(
        f"reset of {len(shards)} shard(s) to {position} requested (id {reset_id}); "
        + (
            "the owning workers apply it within a lease cycle"
            if live
            else "no worker holds them: it applies at the next start"
        )
    )
    if not args.wait:
        return EXIT_OK
    deadline = time.monotonic() + args.wait_s
    while time.monotonic() < deadline:
        pending = [
            sid
            for sid, lease in (await table.read()).leases.items()
            if lease.reset and lease.reset.reset_id == reset_id
        ]
        if not pending:
            print(f"applied to {len(shards)} shard(s)")
            return EXIT_OK
        await asyncio.sleep(0.5)
    print(f"efo: not applied within {args.wait_s:g} s to: {', '.join(pending)} (is a worker running?)", file=sys.stderr)
    return EXIT_RUNTIME


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="efo", description="Kinesis Enhanced Fan-Out to PySpark DataFrames.")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="YAML settings file; EFO_* environment variables win over it")
        return p

    with_config(commands.add_parser("run", help="consume the stream into the sink")).set_defaults(handler=_cmd_run)

    config = commands.add_parser("config", help="check and show the configuration").add_subparsers(
        dest="sub", required=True
    )
    with_config(config.add_parser("validate", help="exit 0 when valid, 2 otherwise; no AWS calls")).set_defaults(
        handler=_cmd_config_validate
    )
    with_config(config.add_parser("show", help="the effective settings as JSON")).set_defaults(handler=_cmd_config_show)
    config.add_parser("table", help="the settings table of the README").set_defaults(handler=_cmd_config_table)

    consumer = commands.add_parser("consumer", help="the EFO consumer").add_subparsers(dest="sub", required=True)
    show = with_config(consumer.add_parser("show", help="describe the consumer"))
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_aws(_consumer_show))
    with_config(consumer.add_parser("register", help="register and wait until ACTIVE; prints the ARN")).set_defaults(
        handler=_aws(_consumer_register), json=False
    )
    dereg = with_config(consumer.add_parser("deregister", help="deregister (operator action only)"))
    dereg.add_argument("--yes", action="store_true")
    dereg.set_defaults(handler=_aws(_consumer_deregister))

    shards = with_config(commands.add_parser("shards", help="the shard tree"))
    shards.add_argument("--json", action="store_true")
    shards.set_defaults(handler=_aws(_shards))

    leases = with_config(commands.add_parser("leases", help="leases and checkpoints in the table"))
    leases.add_argument("--json", action="store_true")
    leases.set_defaults(handler=_aws(_leases))

    checkpoints = commands.add_parser("checkpoints", help="checkpoint maintenance").add_subparsers(
        dest="sub", required=True
    )
    reset = with_config(
        checkpoints.add_parser(
            "reset",
            help="move checkpoints while running (the owners restart those shards there), or delete them all",
            description="Writes a pending reset on each shard's lease; the worker that owns the shard applies it "
            "within a lease cycle by restarting the shard at the new position (no process restart); with no "
            "worker running it applies at the next start. "
            "Example: efo checkpoints reset --all --to LATEST --yes --wait",
        )
    )
    target = reset.add_mutually_exclusive_group()
    target.add_argument("--shard", action="append", metavar="ID", help="a shard to reset (repeatable)")
    target.add_argument("--all", action="store_true", help="every shard of the application")
    target.add_argument(
        "--delete-all", action="store_true", help="delete every lease and checkpoint (a stream deleted and recreated)"
    )
    reset.add_argument(
        "--to", metavar="POSITION", help="LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>, AFTER:<sequence>"
    )
    reset.add_argument("--yes", action="store_true", help="do it (required)")
    reset.add_argument("--wait", action="store_true", help="wait until every owner has applied it")
    reset.add_argument("--wait-s", type=float, default=60.0, help="how long --wait waits (default 60)")
    reset.set_defaults(handler=_aws(_checkpoints_reset))

    from efo.devstack.cli import add_dev_commands

    add_dev_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.handler(args))
    except EfoError as exc:
        print(f"efo: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = EXIT_RUNTIME
    return code


if __name__ == "__main__":
    sys.exit(main())
