"""The peer, side by side: CPU-seconds per 10,000 records draining one stream with async-kinesis and with efo.

On the local stack (kinesis-local behind the conformance proxy, efo.devstack), one stream of
``--shards`` shards is filled with ``--records`` records of ``--record-size`` bytes (JSON text, as
a user's records often are). Each variant then drains the whole stream from TRIM_HORIZON in a
child process of its own, and reports the CPU time (user + system) of that process from just
before its consumer starts until the last record reached it:

* ``async-kinesis``: the Python library a user would otherwise pick (PyPI ``async-kinesis``, a
  bench-only dependency): its ``Consumer`` polling GetRecords, with its ``StringProcessor`` (records
  handed over as ``str``, the lightest of its processors), iterated until every record came;
* ``efo``: efo's subscription layer (:class:`efo.kinesis.subscription.ShardSubscription` per
  shard over SubscribeToShard, a consumer registered for the run, the real PendingPool and
  Handoff) with a no-op driver thread that takes batches and acknowledges them.

Neither runs a sink, leases or checkpoints: this is the part both libraries do, reading records
into the application. Variants alternate; medians of ``--repeats``.

    python bench/peer.py [--shards 4] [--records 10000] [--record-size 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from common import BENCH, ROOT, command_line, hermetic_aws_environment, write_json

VARIANTS = ("async-kinesis", "efo")


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


# ---- the drains (each in a child process) ---------------------------------------------------------


async def drain_async_kinesis(args: argparse.Namespace) -> dict[str, float]:
    from kinesis import Consumer, StringProcessor

    started_cpu, started = _cpu_s(), time.perf_counter()
    received = 0
    async with Consumer(
        args.stream,
        endpoint_url=args.endpoint,
        region_name=args.region,
        iterator_type="TRIM_HORIZON",
        processor=StringProcessor(),
        sleep_time_no_records=0.2,
        use_list_shards=True,
    ) as consumer:
        # Its iteration ends whenever no record came for idle_timeout (kinesis-local can take longer
        # to answer a large GetRecords): iterate again, as its README does, until every record came.
        deadline = time.monotonic() + args.timeout
        while received < args.expect and time.monotonic() < deadline:
            async for _item in consumer:
                received += 1
                if received >= args.expect:
                    break
    return {"records": received, "cpu_s": _cpu_s() - started_cpu, "wall_s": time.perf_counter() - started}


async def drain_efo(args: argparse.Namespace) -> dict[str, float]:
    from efo.aws import Clients, Endpoints
    from efo.config import BatchSettings, PoolSettings, SubscriptionSettings
    from efo.kinesis.subscription import ShardSubscription
    from efo.leases.ledger import CheckpointLedger
    from efo.leases.lifecycle import Commit
    from efo.pipeline.handoff import Handoff
    from efo.pipeline.pool import PendingPool
    from efo.pipeline.records import Position, RecordChunk, shard_key

    class CountingHandoff(Handoff):
        records = 0

        def put(self, chunk: RecordChunk) -> None:
            super().put(chunk)
            self.records += len(chunk)

    started_cpu, started = _cpu_s(), time.perf_counter()
    pool = PendingPool.of(PoolSettings())  # type: ignore[call-arg]
    batch = BatchSettings()  # type: ignore[call-arg]
    subscription_settings = SubscriptionSettings()  # type: ignore[call-arg]
    handoff = CountingHandoff()
    shard_ids = args.shard_ids.split(",")
    ledgers = {shard_id: CheckpointLedger(Position("TRIM_HORIZON")) for shard_id in shard_ids}
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def on_committed(commits: list[Commit]) -> None:
        for commit in commits:
            if commit.grant is not None:
                pool.release(commit.grant)
            ledgers[commit.shard_id].committed(commit.serial, commit.records)

    def drain() -> None:
        while not stop.is_set():
            taken = handoff.take_batch(batch.max_records, batch.max_bytes, batch.max_wait_s, idle_wait_s=0.1)
            if taken:
                loop.call_soon_threadsafe(on_committed, [Commit.of(chunk) for chunk in taken])

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    async with Clients(Endpoints(args.region, args.endpoint, None)) as clients:
        client = clients.subscriber(subscription_settings.read_timeout_s)
        await client.ensure_room(len(shard_ids))
        tasks = []
        for shard_id in shard_ids:
            pool.register(shard_key(args.stream, shard_id))  # the owner the subscription acquires as
            subscription = ShardSubscription(
                client=client,
                consumer_arn=args.consumer_arn,
                stream=args.stream,
                shard_id=shard_id,
                start=Position("TRIM_HORIZON"),
                pool=pool,
                handoff=handoff,
                progress=ledgers[shard_id],
                settings=subscription_settings,
            )
            tasks.append(asyncio.create_task(subscription.run()))
        try:
            while handoff.records < args.expect:
                for task in tasks:
                    if task.done():
                        task.result()  # a failed subscription fails the run
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - started
            cpu = _cpu_s() - started_cpu
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            stop.set()
            handoff.close()
            drainer.join(timeout=5)
    return {"records": handoff.records, "cpu_s": cpu, "wall_s": elapsed}


def child_main(args: argparse.Namespace) -> None:
    hermetic_aws_environment()
    logging.basicConfig(level=logging.WARNING)
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    drain = drain_async_kinesis if args.drain == "async-kinesis" else drain_efo
    print(json.dumps(asyncio.run(drain(args))), flush=True)


# ---- the run -------------------------------------------------------------------------------------


def fill(kinesis: Any, stream: str, records: int, record_size: int) -> None:
    from efo.devstack.producer import put_all

    def payload(i: int) -> bytes:
        head = f'{{"id":{i},"pad":"'
        return (head + "x" * max(0, record_size - len(head) - 2) + '"}').encode()

    put_all(kinesis, stream, ({"Data": payload(i), "PartitionKey": f"pk-{i % 97}"} for i in range(records)))


def register(kinesis: Any, stream_arn: str) -> str:
    arn = kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=f"peer-{uuid.uuid4().hex[:8]}")[
        "Consumer"
    ]["ConsumerARN"]
    deadline = time.monotonic() + 30
    while kinesis.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]["ConsumerStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumer {arn} not ACTIVE")
        time.sleep(0.2)
    return arn


def run_child(variant: str, args: argparse.Namespace, endpoint: str, region: str, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--drain", variant, "--endpoint", endpoint]
    command += ["--region", region, "--expect", str(args.records), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)])}
    completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{variant} drain failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    result = dict(json.loads(completed.stdout.strip().splitlines()[-1]))
    if result["records"] < args.records:
        raise RuntimeError(
            f"{variant} drained {result['records']} of {args.records} records:\n{completed.stderr[-3000:]}"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--records", type=int, default=10_000, help="records in the stream, all shards together")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a drain may take")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    # the child's own arguments
    parser.add_argument("--drain", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--region", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--consumer-arn", help=argparse.SUPPRESS)
    parser.add_argument("--shard-ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain:
        child_main(args)
        return

    from efo.devstack.producer import kinesis_client, wait_active
    from efo.devstack.stack import LocalStack

    hermetic_aws_environment()
    workdir = Path(tempfile.mkdtemp(prefix="efo-bench-peer-"))
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    began = time.perf_counter()
    with LocalStack(log_dir=workdir / "stack") as stack:
        kinesis = kinesis_client(stack.kinesis_endpoint, stack.region)
        stream = f"peer-{uuid.uuid4().hex[:6]}"
        kinesis.create_stream(StreamName=stream, ShardCount=args.shards)
        wait_active(kinesis, stream, timeout_s=60)
        stream_arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
        shard_ids = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
        filled_at = time.perf_counter()
        fill(kinesis, stream, args.records, args.record_size)
        fill_s = time.perf_counter() - filled_at
        for repeat in range(args.repeats):
            for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                extra = ["--stream", stream]
                if variant == "efo":  # a consumer of its own per run: the stack refuses a re-subscription for seconds
                    extra += ["--consumer-arn", register(kinesis, stream_arn), "--shard-ids", ",".join(shard_ids)]
                result = run_child(variant, args, stack.kinesis_endpoint, stack.region, extra)
                results[variant].append(result)
                print(
                    f"  {variant:13} {result['records']:>7,} records: {result['cpu_s']:.2f} CPU-s, "
                    f"{result['wall_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    elapsed = time.perf_counter() - began

    def per_10k(variant: str) -> float:
        return statistics.median(r["cpu_s"] / r["records"] * 10_000 for r in results[variant])

    print(f"command: `{command_line()}`\n")
    print(
        f"One stream of {args.shards} shards holding {args.records:,} records of {args.record_size} B (JSON text) "
        f"on the local stack (kinesis-local behind the conformance proxy; filled in {fill_s:.0f} s), drained "
        f"whole from TRIM_HORIZON by each variant in a process of its own; CPU time (user + system) of that "
        f"process from its consumer's start to the last record; medians of {args.repeats}, alternating; "
        f"{elapsed:.0f} s in all\n"
    )
    print("| consumer | CPU-s per 10,000 records | wall s to drain | records/s per core | vs efo |")
    print("|---|---:|---:|---:|---:|")
    for variant in VARIANTS:
        cost = per_10k(variant)
        wall = statistics.median(r["wall_s"] for r in results[variant])
        label = "async-kinesis 3.0.1 (GetRecords)" if variant == "async-kinesis" else "efo (SubscribeToShard)"
        print(f"| {label} | {cost:.3f} | {wall:.1f} | {10_000 / cost:,.0f} | {cost / per_10k('efo'):.2f}x |")
    write_json(
        args.json,
        {"runs": results, "per_10k": {v: per_10k(v) for v in VARIANTS}, "records": args.records},
    )


if __name__ == "__main__":
    main()
