"""Client CPU per DynamoDB call of the lease plane: efo's DynamoDB client against one validating requests.

A worker's steady DynamoDB traffic is a checkpoint write per shard every few seconds, a heartbeat,
and a Query of a lease partition when its version moved: at thousands of shards per worker its
CPU is that of the client building, signing and parsing each call. Both variants make the same
calls through efo's own ``LeaseTable`` (``checkpoint``, ``heartbeat``, ``read_leases``) against the
local DynamoDB (a process of its own, so this process's CPU time is the client's):

* ``efo``: ``efo.aws.Clients.dynamodb()``, the client the service uses;
* ``validating``: the same settings (``efo.aws.dynamodb_config``) with botocore's parameter validation
  on, its default.

Rounds alternate between the two, each ``--calls`` calls of each kind, ``--concurrency`` at once
(the checkpointer's 16); medians of the rounds' CPU per call.

    python bench/dynamodb_client.py [--shards 64] [--calls 640] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiobotocore.config import AioConfig
from common import command_line, hermetic_aws_environment, start_dynamodb, write_json

from efo.aws import Clients, Endpoints, dynamodb_config
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position

STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/bench"
VARIANTS = ("validating", "efo")
KINDS = ("checkpoint", "heartbeat", "read_leases")


async def _validating_client(clients: Clients) -> Any:
    """efo's DynamoDB client with botocore's parameter validation on."""
    config = dynamodb_config().merge(AioConfig(parameter_validation=True))
    return await clients._enter("dynamodb", clients.endpoints.dynamodb, config)


async def _cpu_per_call(calls: int, concurrency: int, call: Callable[[int], Awaitable[Any]]) -> float:
    """Process CPU-seconds per call of ``calls`` calls, ``concurrency`` at once."""
    started = time.process_time()
    for first in range(0, calls, concurrency):
        await asyncio.gather(*(call(i) for i in range(first, min(calls, first + concurrency))))
    return (time.process_time() - started) / calls


async def measure(endpoint: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    async with Clients(Endpoints("us-east-1", None, endpoint)) as clients:
        ddbs = {"efo": await clients.dynamodb(), "validating": await _validating_client(clients)}
        tables = {
            variant: LeaseTable(ddb, table="bench", app="bench", stream_arn=STREAM_ARN, worker_id="w-bench")
            for variant, ddb in ddbs.items()
        }
        table = tables["efo"]
        await table.ensure_table(create=True)
        now = datetime.now(UTC)
        await table.create_meta(now, "TRIM_HORIZON", now)
        shard_ids = [f"shardId-{i:012d}" for i in range(args.shards)]
        for shard_id in shard_ids:
            await table.create_lease(shard_id, (), Position("TRIM_HORIZON"))
        await table.complete_meta()
        leases = (await table.read_leases()).leases
        claimed = [await table.claim(leases[shard_id]) for shard_id in shard_ids]
        for variant in VARIANTS:  # each variant reads the layout once, outside the rounds
            await tables[variant].read_leases()

        def calls(variant: str) -> dict[str, Callable[[int], Awaitable[Any]]]:
            t = tables[variant]
            return {
                "checkpoint": lambda i: t.checkpoint(
                    claimed[i % len(claimed)], Position("AFTER_SEQUENCE_NUMBER", str(10**20 + i)), lag_ms=i
                ),
                "heartbeat": lambda i: t.heartbeat(),
                "read_leases": lambda i: t.read_leases(),
            }

        figures: dict[str, dict[str, list[float]]] = {v: {k: [] for k in KINDS} for v in VARIANTS}
        for round_ in range(args.rounds + 1):  # the first round warms both up and is not counted
            order = VARIANTS if round_ % 2 else VARIANTS[::-1]
            for variant in order:
                for kind, call in calls(variant).items():
                    count = args.calls if kind != "read_leases" else max(1, args.calls // 8)
                    cpu = await _cpu_per_call(count, args.concurrency, call)
                    if round_:
                        figures[variant][kind].append(cpu)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=64, help="leases in the table (rows a Query reads)")
    parser.add_argument("--calls", type=int, default=640, help="calls of each kind per round (Queries: an eighth)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    hermetic_aws_environment()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="efo-bench-ddb-") as workdir:
        server, endpoint = start_dynamodb(Path(workdir))
        try:
            figures = asyncio.run(measure(endpoint, args))
        finally:
            server.kill()
            server.wait()
    medians = {v: {k: statistics.median(figures[v][k]) for k in KINDS} for v in VARIANTS}
    print(f"command: `{command_line()}`\n")
    print(
        "client CPU (this process; the local DynamoDB is another) per call of efo's LeaseTable, "
        f"{args.shards} leases, {args.concurrency} calls at once, median of {args.rounds} alternating rounds; "
        f"{time.monotonic() - started:.0f} s in all\n"
    )
    print("| call | validating, ms | efo, ms | efo / validating |")
    print("|---|---:|---:|---:|")
    for kind in KINDS:
        base, ours = medians["validating"][kind], medians["efo"][kind]
        print(f"| {kind} | {1000 * base:.3f} | {1000 * ours:.3f} | {ours / base:.2f} |")
    write_json(args.json, {"medians_s": medians, "rounds_s": figures})


if __name__ == "__main__":
    main()
