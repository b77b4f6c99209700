"""``efo dev``: the local AWS stack in the background, and what a first hour on it needs without
the AWS CLI: ``up``, ``status``, ``down``, ``env`` (the ``export`` lines for a shell), ``stream
create|delete|list`` and ``put`` (records of a size, at a rate, as a real producer writes them).

The stack's state (its endpoints and processes) lives in one per-user place, so that every
``efo dev`` command finds it from any directory: ``--state-dir``, else ``EFO_DEV_STATE_DIR``, else
``$XDG_STATE_HOME/efo/dev``, else ``~/.local/state/efo/dev``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from efo.config import DURATION_ALLOWED, duration_s
from efo.devstack.producer import kinesis_client, wait_active, wait_deleted
from efo.devstack.stack import (
    DEFAULT_REGION,
    DEFAULT_SHARD_LIMIT,
    LocalStack,
    StackEndpoints,
    StackError,
    is_running,
    read_state,
    state_path,
    stop_processes,
    write_state,
)
from efo.devstack.traffic import Producer, Traffic
from efo.errors import EfoError, error_code, translate

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
#: Overrides the per-user place of the stack's state (``--state-dir`` overrides it).
STATE_DIR_VARIABLE = "EFO_DEV_STATE_DIR"
#: The dummy credentials the stack accepts (requests must be signed; any key does).
DUMMY_ACCESS_KEY = "test"
STREAM_ACTIVE_TIMEOUT_S = 30.0


def default_state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the stack's state lives unless ``--state-dir`` says: ``EFO_DEV_STATE_DIR``, else
    ``$XDG_STATE_HOME/efo/dev``, else ``~/.local/state/efo/dev``: per user, whatever the directory."""
    if environ.get(STATE_DIR_VARIABLE):
        return Path(environ[STATE_DIR_VARIABLE]).expanduser()
    base = Path(environ["XDG_STATE_HOME"]).expanduser() if environ.get("XDG_STATE_HOME") else None
    return (base or Path.home() / ".local" / "state") / "efo" / "dev"


def shell_environment(endpoints: StackEndpoints) -> dict[str, str]:
    """What a shell needs to use the stack: dummy credentials, the region (``AWS_DEFAULT_REGION``,
    which the AWS SDKs and CLI read), the endpoints for efo and for the AWS CLI v2 / SDKs
    (``AWS_ENDPOINT_URL_<SERVICE>``). Its names are :data:`SHELL_VARIABLES`."""
    values = (
        DUMMY_ACCESS_KEY,
        DUMMY_ACCESS_KEY,
        endpoints.region,
        endpoints.kinesis_endpoint,
        endpoints.dynamodb_endpoint,
        endpoints.region,
        endpoints.kinesis_endpoint,
        endpoints.dynamodb_endpoint,
    )
    return dict(zip(SHELL_VARIABLES, values, strict=True))


SHELL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_KINESIS",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "EFO_REGION",
    "EFO_KINESIS_ENDPOINT",
    "EFO_DYNAMODB_ENDPOINT",
)


def export_lines(endpoints: StackEndpoints) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in shell_environment(endpoints).items()]


def _duration(text: str) -> float:
    try:
        return duration_s(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {DURATION_ALLOWED}") from None


def add_dev_commands(subparsers: Any) -> None:
    """Register the ``dev`` commands on an argparse subparsers object."""
    dev = subparsers.add_parser(
        "dev",
        help="local AWS stack (kinesis-local + proxy + moto DynamoDB)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = dev.add_subparsers(dest="dev_command", required=True, metavar="{up,status,down,env,stream,put}")

    up = commands.add_parser("up", help="start the stack in the background")
    up.add_argument("--json", action="store_true", help="print one JSON object with the endpoints")
    up.add_argument("--kinesis-port", type=int, help="kinesis-local port (default: a free port)")
    up.add_argument("--dynamodb-port", type=int, help="moto DynamoDB port (default: a free port)")
    up.add_argument("--proxy-port", type=int, help="proxy port clients use (default: a free port)")
    up.add_argument("--region", default=DEFAULT_REGION)
    up.add_argument(
        "--subscription-lifetime-s", type=_duration, default=0.0, help="end subscriptions after this long (0 off)"
    )
    up.add_argument(
        "--shard-limit",
        type=int,
        default=DEFAULT_SHARD_LIMIT,
        help=f"open shards kinesis-local allows across all streams (default {DEFAULT_SHARD_LIMIT})",
    )
    _state_dir_option(up)
    up.set_defaults(handler=cmd_up)

    down = commands.add_parser("down", help="stop the stack started by `up`")
    _state_dir_option(down)
    down.set_defaults(handler=cmd_down)

    status = commands.add_parser("status", help="show whether the stack is running")
    status.add_argument("--json", action="store_true")
    _state_dir_option(status)
    status.set_defaults(handler=cmd_status)

    env = commands.add_parser(
        "env", help='the export lines for a shell: eval "$(efo dev env)"', description="Print the export lines."
    )
    env.add_argument("--unset", action="store_true", help="print the unset line instead (back to your own AWS)")
    env.add_argument("--json", action="store_true")
    _state_dir_option(env)
    env.set_defaults(handler=cmd_env)

    stream = commands.add_parser("stream", help="create, delete or list streams on the stack")
    streams = stream.add_subparsers(dest="stream_command", required=True, metavar="{create,delete,list}")
    create = streams.add_parser("create", help="create a stream and wait until it is ACTIVE")
    create.add_argument("name")
    create.add_argument("--shards", type=int, default=1, help="its shards (default 1)")
    create.add_argument("--wait-s", type=_duration, default=STREAM_ACTIVE_TIMEOUT_S, help="how long to wait")
    _state_dir_option(create)
    create.set_defaults(handler=cmd_stream_create)
    delete = streams.add_parser("delete", help="delete a stream (and its consumers) and wait until it is gone")
    delete.add_argument("name")
    delete.add_argument("--wait-s", type=_duration, default=STREAM_ACTIVE_TIMEOUT_S, help="how long to wait")
    _state_dir_option(delete)
    delete.set_defaults(handler=cmd_stream_delete)
    listing = streams.add_parser("list", help="the stack's streams and their open shards")
    listing.add_argument("--json", action="store_true")
    _state_dir_option(listing)
    listing.set_defaults(handler=cmd_stream_list)

    put = commands.add_parser(
        "put",
        help="put records into a stream as a producer would",
        description='Put COUNT records of SIZE bytes (JSON: {"n": ..., "key": ..., "pad": ...}) over KEYS '
        "partition keys in turn, at RATE records a second (0: as fast as Kinesis takes them), optionally "
        "KPL-aggregated; PutRecords of at most 500 records and 5 MiB, refused records put again.",
    )
    put.add_argument("name", help="the stream")
    put.add_argument("--count", type=int, default=1000, help="records to put (default 1000)")
    put.add_argument("--size", type=int, default=100, help="bytes of each record's data (default 100)")
    put.add_argument("--keys", type=int, default=16, help="distinct partition keys, used in turn (default 16)")
    put.add_argument("--rate", type=float, default=0.0, help="records a second (default 0: as fast as it goes)")
    put.add_argument("--aggregate", type=int, default=0, help="records to a KPL aggregate (default 0: none)")
    put.add_argument("--first", type=int, default=0, help="number of the first record (default 0)")
    put.add_argument("--json", action="store_true", help="print what Kinesis acknowledged as JSON")
    _state_dir_option(put)
    put.set_defaults(handler=cmd_put)


def _state_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"where stack.json and the logs live (default: ${STATE_DIR_VARIABLE}, else "
        "$XDG_STATE_HOME/efo/dev, else ~/.local/state/efo/dev)",
    )


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir is not None else default_state_dir()


def _error(message: str) -> None:
    print(f"efo dev: {message}", file=sys.stderr)


def _describe(endpoints: StackEndpoints) -> list[str]:
    return [
        f"kinesis endpoint:   {endpoints.kinesis_endpoint}   (proxy; use this)",
        f"kinesis upstream:   {endpoints.kinesis_upstream_endpoint}   (raw kinesis-local, diagnostics only)",
        f"dynamodb endpoint:  {endpoints.dynamodb_endpoint}",
        f"region:             {endpoints.region}",
        f"shard limit:        {'not recorded' if endpoints.shard_limit is None else endpoints.shard_limit}",
        f"logs:               {endpoints.log_dir}",
    ]


def _nothing_here(state_dir: Path) -> str:
    return (
        f"no stack state in {state_path(state_dir)}; a stack started with another --state-dir (or "
        f"{STATE_DIR_VARIABLE}) is found with the same one"
    )


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    for name in ("kinesis_port", "dynamodb_port", "proxy_port"):
        port = getattr(args, name)
        if port is not None and not 1 <= port <= 65535:
            _error(f"--{name.replace('_', '-')} must be in 1..65535")
            return EXIT_USAGE
    if args.subscription_lifetime_s < 0:
        _error("--subscription-lifetime-s must be >= 0")
        return EXIT_USAGE
    if args.shard_limit < 1:
        _error("--shard-limit must be >= 1")
        return EXIT_USAGE
    try:
        state = read_state(state_dir)
    except StackError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if state is not None and any(is_running(p) for p in state[1]):
        _error(f"a stack from {state_path(state_dir)} is already running; run `efo dev down` first")
        return EXIT_USAGE
    stack = LocalStack(
        region=args.region,
        kinesis_port=args.kinesis_port,
        proxy_port=args.proxy_port,
        dynamodb_port=args.dynamodb_port,
        subscription_lifetime_s=args.subscription_lifetime_s,
        shard_limit=args.shard_limit,
        log_dir=(state_dir / "logs").resolve(),
        die_with_parent=False,
    )
    try:
        endpoints = stack.start()
        path = write_state(state_dir, endpoints, stack.processes)
    except (StackError, OSError) as exc:
        stack.stop()
        _error(str(exc))
        return EXIT_RUNTIME
    if args.json:
        print(
            json.dumps({**endpoints.to_json(), "state_file": str(path.resolve()), "env": shell_environment(endpoints)})
        )
    else:
        print("efo dev stack is up")
        print("\n".join(_describe(endpoints)))
        print(f"state file:         {path}")
        print('\nto use it from this shell, run: eval "$(efo dev env)"   (it prints:)')
        print("\n".join(export_lines(endpoints)))
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    try:
        state = read_state(state_dir)
    except StackError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if state is None:
        print(f"{_nothing_here(state_dir)}; nothing to stop")
        return EXIT_OK
    try:
        stop_processes(state[1])
    except StackError as exc:
        _error(str(exc))
        return EXIT_RUNTIME
    state_path(state_dir).unlink(missing_ok=True)
    print(f"efo dev stack stopped (state was in {state_path(state_dir)})")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    try:
        state = read_state(state_dir)
    except StackError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if state is None:
        if args.json:
            print(json.dumps({"running": False, "processes": [], "state_file": str(state_path(state_dir))}))
        else:
            print(f"not running ({_nothing_here(state_dir)})")
        return EXIT_RUNTIME
    endpoints, processes = state
    alive = {p.name: is_running(p) for p in processes}
    running = all(alive.values())
    if args.json:
        print(
            json.dumps(
                {
                    "running": running,
                    **endpoints.to_json(),
                    "state_file": str(state_path(state_dir)),
                    "processes": [{"name": p.name, "pid": p.pid, "running": alive[p.name]} for p in processes],
                }
            )
        )
    else:
        print("running" if running else "NOT running (some processes are gone; `efo dev down` cleans up)")
        print("\n".join(_describe(endpoints)))
        print(f"state file:         {state_path(state_dir)}")
        for p in processes:
            print(f"  {p.name:<14} pid {p.pid:<8} {'running' if alive[p.name] else 'gone'}")
    return EXIT_OK if running else EXIT_RUNTIME


def _running_stack(args: argparse.Namespace) -> StackEndpoints | None:
    """The endpoints of the stack ``up`` started, or None after saying why there is none."""
    state_dir = _state_dir(args)
    try:
        state = read_state(state_dir)
    except StackError as exc:
        _error(str(exc))
        return None
    if state is None:
        _error(f"no local stack is running ({_nothing_here(state_dir)}): start one with `efo dev up`")
        return None
    endpoints, processes = state
    gone = [p.name for p in processes if not is_running(p)]
    if gone:
        _error(f"the stack of {state_path(state_dir)} is not running ({', '.join(gone)} gone): `efo dev down`, then up")
        return None
    return endpoints


def cmd_env(args: argparse.Namespace) -> int:
    if args.unset:
        print(f"unset {' '.join(SHELL_VARIABLES)}")
        return EXIT_OK
    endpoints = _running_stack(args)
    if endpoints is None:
        return EXIT_RUNTIME
    if args.json:
        print(json.dumps(shell_environment(endpoints)))
    else:
        print("\n".join(export_lines(endpoints)))
    return EXIT_OK


def _kinesis(endpoints: StackEndpoints) -> Any:
    return kinesis_client(endpoints.kinesis_endpoint, endpoints.region)


def _fail(error: EfoError) -> int:
    _error(str(error))
    return error.exit_code


def cmd_stream_create(args: argparse.Namespace) -> int:
    if args.shards < 1:
        _error(f"--shards {args.shards}: allowed: 1 or more")
        return EXIT_USAGE
    endpoints = _running_stack(args)
    if endpoints is None:
        return EXIT_RUNTIME
    kinesis = _kinesis(endpoints)
    started = time.monotonic()
    try:
        kinesis.create_stream(StreamName=args.name, ShardCount=args.shards)
    except Exception as exc:
        if error_code(exc) != "ResourceInUseException":
            return _fail(
                translate(
                    exc,
                    resource=f"stream {args.name!r}",
                    hint=f"at most {endpoints.shard_limit} open shards on this stack",
                )
            )
        summary = kinesis.describe_stream_summary(StreamName=args.name)["StreamDescriptionSummary"]
        print(f"stream {args.name!r} exists already ({summary['OpenShardCount']} open shards); nothing done")
        return EXIT_OK
    try:
        wait_active(kinesis, args.name, args.wait_s)
    except TimeoutError:
        _error(f"stream {args.name!r} was created but is not ACTIVE after {args.wait_s:g} s; see `efo dev stream list`")
        return EXIT_RUNTIME
    print(f"stream {args.name!r} created with {args.shards} shard(s), ACTIVE after {time.monotonic() - started:.1f} s")
    return EXIT_OK


def cmd_stream_delete(args: argparse.Namespace) -> int:
    endpoints = _running_stack(args)
    if endpoints is None:
        return EXIT_RUNTIME
    kinesis = _kinesis(endpoints)
    try:
        kinesis.delete_stream(StreamName=args.name, EnforceConsumerDeletion=True)
        wait_deleted(kinesis, args.name, args.wait_s)
    except TimeoutError as exc:
        _error(f"{exc}; see `efo dev stream list`")
        return EXIT_RUNTIME
    except Exception as exc:
        return _fail(translate(exc, resource=f"stream {args.name!r}", hint="see `efo dev stream list`"))
    print(f"stream {args.name!r} deleted, with its consumers")
    return EXIT_OK


def cmd_stream_list(args: argparse.Namespace) -> int:
    endpoints = _running_stack(args)
    if endpoints is None:
        return EXIT_RUNTIME
    kinesis = _kinesis(endpoints)
    names: list[str] = []
    request: dict[str, Any] = {}
    while True:
        page = kinesis.list_streams(**request)
        names += page.get("StreamNames", [])
        if not page.get("HasMoreStreams"):
            break
        request = {"ExclusiveStartStreamName": names[-1]}
    rows = []
    for name in names:
        try:
            summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                continue  # deleted since it was listed
            return _fail(translate(exc, resource=f"stream {name!r}"))
        rows.append({"stream": name, "status": summary["StreamStatus"], "open_shards": summary["OpenShardCount"]})
    if args.json:
        print(json.dumps(rows))
    elif not rows:
        print("no streams on the local stack: `efo dev stream create NAME --shards N`", file=sys.stderr)
    else:
        for row in rows:
            print(f"{row['stream']}  {row['status']}  {row['open_shards']} open shard(s)")
    return EXIT_OK


def cmd_put(args: argparse.Namespace) -> int:
    traffic = Traffic(
        count=args.count,
        size_bytes=args.size,
        keys=args.keys,
        rate_per_s=args.rate,
        aggregate=args.aggregate,
        first=args.first,
    )
    problems = traffic.problems()
    if problems:
        _error("; ".join(problems))
        return EXIT_USAGE
    endpoints = _running_stack(args)
    if endpoints is None:
        return EXIT_RUNTIME
    kinesis = _kinesis(endpoints)
    try:
        kinesis.describe_stream_summary(StreamName=args.name)
    except Exception as exc:
        error = translate(exc, resource=f"stream {args.name!r}", hint=f"create it: efo dev stream create {args.name}")
        return _fail(error)
    producer = Producer(kinesis, args.name)
    console = Console(stderr=True)
    try:
        if console.is_terminal and not args.json:
            columns = (TextColumn(f"put {args.name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=console, transient=True) as bar:
                task = bar.add_task("put", total=traffic.count)
                report = producer.put(traffic, lambda records: bar.update(task, completed=records))
        else:
            report = producer.put(traffic)
    except EfoError as error:
        return _fail(error)
    if args.json:
        print(json.dumps({"stream": args.name, **report.to_json()}))
        return EXIT_OK
    rate = report.records / report.seconds if report.seconds > 0 else float("inf")
    aggregated = f" in {report.kinesis_records} KPL aggregates" if traffic.aggregate else ""
    print(
        f"put {report.records:,} records of {traffic.size_bytes} bytes{aggregated} to stream {args.name!r} over "
        f"{traffic.keys} partition keys in {report.seconds:.1f} s ({rate:,.0f} records/s); by shard: "
        + ", ".join(f"{shard} {count}" for shard, count in sorted(report.shards.items()))
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m efo.devstack.cli dev up``) for tests and scripts."""
    parser = argparse.ArgumentParser(prog="efo")
    add_dev_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
