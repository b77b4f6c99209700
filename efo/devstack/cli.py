"""``efo dev up|down|status``: run the local AWS stack in the background."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

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

DEFAULT_STATE_DIR = Path(".efo-dev")
EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


def add_dev_commands(subparsers: Any) -> None:
    """Register ``dev up|down|status`` on an argparse subparsers object."""
    dev = subparsers.add_parser("dev", help="local AWS stack (kinesis-local + proxy + moto DynamoDB)")
    commands = dev.add_subparsers(dest="dev_command", required=True, metavar="{up,down,status}")

    up = commands.add_parser("up", help="start the stack in the background")
    up.add_argument("--json", action="store_true", help="print one JSON object with the endpoints")
    up.add_argument("--kinesis-port", type=int, help="kinesis-local port (default: a free port)")
    up.add_argument("--dynamodb-port", type=int, help="moto DynamoDB port (default: a free port)")
    up.add_argument("--proxy-port", type=int, help="proxy port clients use (default: a free port)")
    up.add_argument("--region", default=DEFAULT_REGION)
    up.add_argument("--subscription-lifetime-s", type=float, default=0.0, help="end subscriptions after N s (0 off)")
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


def _state_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="where stack.json and logs live (default .efo-dev)"
    )


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


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
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
        print(json.dumps({**endpoints.to_json(), "state_file": str(path.resolve())}))
    else:
        print("efo dev stack is up")
        print("\n".join(_describe(endpoints)))
        print(f"state file:         {path}")
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    try:
        state = read_state(args.state_dir)
    except StackError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if state is None:
        print(f"no stack state in {args.state_dir}; nothing to stop")
        return EXIT_OK
    try:
        stop_processes(state[1])
    except StackError as exc:
        _error(str(exc))
        return EXIT_RUNTIME
    state_path(args.state_dir).unlink(missing_ok=True)
    print("efo dev stack stopped")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    try:
        state = read_state(args.state_dir)
    except StackError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if state is None:
        if args.json:
            print(json.dumps({"running": False, "processes": []}))
        else:
            print(f"not running (no state in {args.state_dir})")
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
                    "processes": [{"name": p.name, "pid": p.pid, "running": alive[p.name]} for p in processes],
                }
            )
        )
    else:
        print("running" if running else "NOT running (some processes are gone; `efo dev down` cleans up)")
        print("\n".join(_describe(endpoints)))
        for p in processes:
            print(f"  {p.name:<14} pid {p.pid:<8} {'running' if alive[p.name] else 'gone'}")
    return EXIT_OK if running else EXIT_RUNTIME


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
