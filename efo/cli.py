"""The ``efo`` command: run the service, check configuration, operate consumers, shards and leases.

Exit codes for every command: 0 success, 1 runtime failure, 2 usage or configuration error,
3 a named resource not found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from efo.aws import Clients, Endpoints
from efo.config import Settings, load_settings, settings_table
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME, EfoError, ResourceNotFound
from efo.kinesis.registration import describe_consumer, describe_stream, ensure_consumer
from efo.kinesis.shards import list_shards
from efo.leases.table import LeaseTable


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


async def _checkpoints_reset(settings: Settings, clients: Clients, stream: Any, args: argparse.Namespace) -> int:
    if not args.yes:
        print("refusing to reset without --yes: the next start applies EFO_INITIAL_POSITION again", file=sys.stderr)
        return EXIT_CONFIG
    table = _table(settings, await clients.dynamodb(), stream)
    await table.ensure_table(create=False)
    removed = await table.delete_all()
    print(
        f"removed {removed} rows of application {settings.app!r} on stream {stream.name!r} from table {table.table!r}"
    )
    return EXIT_OK


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
    reset = with_config(checkpoints.add_parser("reset", help="delete every lease and checkpoint of the application"))
    reset.add_argument("--yes", action="store_true")
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
