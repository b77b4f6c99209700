"""Ingest throughput: stock aiobotocore vs a boto3 thread per shard vs efo's subscription path.

A synthetic SubscribeToShard server (bench/synthetic_server.py) runs in its own process on
127.0.0.1 (pinned to another CPU than this one when there are two), streaming events as fast as
the client reads. For each shard count and record size, in the same run, interleaved:

* ``stock``: aiobotocore, one task per shard iterating ``response["EventStream"]`` (botocore's
  parser with its default datetime timestamps), counting records;
* ``stock-epoch`` (only with ``--variants``): the same through efo's data-plane client, whose
  parser turns timestamps into epoch-seconds floats instead of datetimes (efo before efo.kinesis.decoder);
* ``boto3``: a boto3 thread per shard iterating its EventStream and putting each event's records
  on a ``queue.Queue`` that the main thread drains and counts;
* ``parse``: the parse limit, no network, no pool, no handoff: the same event frames the server
  sends, cut into 64 KiB pieces (what one socket read hands aiohttp), through botocore's
  ``EventStreamBuffer`` (framing and CRCs) and efo's payload decoder (msgspec, or orjson and
  pybase64) in a tight loop;
* ``parse-efo``: the same, framed by efo's :class:`efo.kinesis.framing.Framer` instead;
* ``efo-botocore`` (only with ``--variants``): ``efo`` below with botocore's framing
  (``efo.kinesis.decoder.FRAMING = "botocore"``, what ``EFO_TEST_FRAMING=botocore`` selects);
* ``efo``: :class:`efo.kinesis.subscription.ShardSubscription` with efo's data-plane client, its real
  :class:`PendingPool` and :class:`Handoff`, and a no-op drain thread that takes batches from the
  handoff and acknowledges them the way the Spark driver does (the grants are released on the
  loop thread through ``call_soon_threadsafe``, as ``Coordinator.on_committed`` does). Records are
  counted as they are handed off, so the rate includes pool admission.

The variants that run efo's decoding (parse, parse-efo, efo-botocore, efo) run with the garbage
collector as ``efo run`` sets it (:func:`efo.gc_tuning.tune`: start-up frozen, young threshold
10,000), the others with CPython's defaults, as their programs would; the table says so.

Each measurement: ``--warmup`` seconds, then records counted over ``--seconds``. The table shows
the median of ``--repeats`` measurements per cell. Run from the repository root:

    .venv/bin/python bench/ingest.py [--shards 1,8,64] [--record-size 1024,10240] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.eventstream import EventStreamBuffer
from common import REGION, command_line, hermetic_aws_environment, pin_cpus, start_synthetic_server, write_json
from synthetic_server import FIRST_SEQUENCE, EventFactory, consumer_arn

from efo import gc_tuning
from efo.aws import Clients, Endpoints
from efo.config import BatchSettings, PoolSettings, SubscriptionSettings
from efo.kinesis import decoder
from efo.kinesis.decoder import decode_message
from efo.kinesis.framing import Framer
from efo.kinesis.subscription import ShardSubscription
from efo.leases.ledger import CheckpointLedger
from efo.leases.lifecycle import Commit
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, RecordChunk, shard_key

VARIANTS = ("stock", "stock-epoch", "boto3", "parse", "parse-efo", "efo-botocore", "efo")
DEFAULT_VARIANTS = ("stock", "boto3", "parse", "parse-efo", "efo")
LABELS = {
    "stock": "stock aiobotocore",
    "stock-epoch": "aiobotocore, epoch-seconds parser",
    "boto3": "boto3 threads",
    "parse": "parse limit",
    "parse-efo": "parse limit on efo's framing",
    "efo-botocore": "efo on botocore's framing",
    "efo": "efo",
}


@dataclass
class Case:
    shards: int
    record_bytes: int
    records_per_event: int

    @property
    def arn(self) -> str:
        return consumer_arn(self.record_bytes, self.records_per_event)

    @property
    def shard_ids(self) -> list[str]:
        return [f"shardId-{i:012d}" for i in range(self.shards)]


@dataclass
class Window:
    warmup_s: float
    seconds: float


async def _measure_async(count: Callable[[], int], tasks: list[asyncio.Task[Any]], window: Window) -> float:
    """Records per second over the window, after the warm-up; fails if a reader died."""

    def check() -> None:
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"a reader failed: {task.exception()!r}")

    await asyncio.sleep(window.warmup_s)
    check()
    start, started_at = count(), time.perf_counter()
    await asyncio.sleep(window.seconds)
    end, ended_at = count(), time.perf_counter()
    check()
    return (end - start) / (ended_at - started_at)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---- (a) stock aiobotocore -------------------------------------------------------------------


async def run_stock(endpoint: str, case: Case, window: Window, *, epoch_seconds: bool = False) -> float:
    async with AsyncExitStack() as stack:
        if epoch_seconds:
            clients = await stack.enter_async_context(Clients(Endpoints(REGION, endpoint, None)))
            client = clients.subscriber(30)
            await client.ensure_room(case.shards)
        else:
            config = AioConfig(
                retries={"total_max_attempts": 1}, read_timeout=30, max_pool_connections=2 * case.shards + 16
            )
            client = await stack.enter_async_context(
                get_session().create_client("kinesis", region_name=REGION, endpoint_url=endpoint, config=config)
            )
        received = 0

        async def read(shard_id: str) -> None:
            nonlocal received
            response = await client.subscribe_to_shard(
                ConsumerARN=case.arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"}
            )
            stream = response["EventStream"]
            try:
                async for event in stream:
                    payload = event.get("SubscribeToShardEvent")
                    if payload is not None:
                        received += len(payload["Records"])
            finally:
                stream.close()

        tasks = [asyncio.create_task(read(shard_id)) for shard_id in case.shard_ids]
        try:
            return await _measure_async(lambda: received, tasks, window)
        finally:
            await _cancel(tasks)


# ---- (b) a boto3 thread per shard -------------------------------------------------------------


def run_boto3(endpoint: str, case: Case, window: Window) -> float:
    config = botocore.config.Config(
        retries={"total_max_attempts": 1}, read_timeout=30, max_pool_connections=2 * case.shards + 16
    )
    client = boto3.session.Session().client("kinesis", region_name=REGION, endpoint_url=endpoint, config=config)
    events: queue.Queue[list[dict[str, Any]]] = queue.Queue(maxsize=4 * case.shards)
    stop = threading.Event()
    failures: list[BaseException] = []

    def read(shard_id: str) -> None:
        try:
            response = client.subscribe_to_shard(
                ConsumerARN=case.arn, ShardId=shard_id, StartingPosition={"Type": "LATEST"}
            )
            stream = response["EventStream"]
            try:
                for event in stream:
                    payload = event.get("SubscribeToShardEvent")
                    if payload is not None:
                        while not stop.is_set():
                            try:
                                events.put(payload["Records"], timeout=0.1)
                                break
                            except queue.Full:
                                pass
                    if stop.is_set():
                        return
            finally:
                stream.close()
        except BaseException as exc:
            if not stop.is_set():
                failures.append(exc)

    threads = [threading.Thread(target=read, args=(s,), daemon=True) for s in case.shard_ids]
    for thread in threads:
        thread.start()
    received = 0
    started_at = time.perf_counter()
    phase_end = started_at + window.warmup_s
    start = None
    try:
        while True:
            now = time.perf_counter()
            if now >= phase_end:
                if start is None:
                    start, measured_from = received, now
                    phase_end = now + window.seconds
                    continue
                if failures:
                    raise RuntimeError(f"a reader failed: {failures[0]!r}")
                return (received - start) / (now - measured_from)
            try:
                received += len(events.get(timeout=0.05))
            except queue.Empty:
                pass
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        client.close()


# ---- (c) the parse limit: framing and payload decoding of the same bytes, nothing else ----------

READ_BYTES = 64 * 1024  # what one socket read hands aiohttp's stream, at most


def run_parse_limit(case: Case, window: Window, *, own_framing: bool = False) -> float:
    factory = EventFactory(case.record_bytes, case.records_per_event)
    frame = factory.buffer()
    wire = b"".join(bytes(factory.next_event(frame, FIRST_SEQUENCE + i * case.records_per_event)) for i in range(64))
    pieces = [wire[i : i + READ_BYTES] for i in range(0, len(wire), READ_BYTES)]
    records = 0
    clock = time.perf_counter
    started = clock()
    measure_from = started + window.warmup_s
    start_count: int | None = None
    while True:
        if own_framing:
            framer = Framer()
            for piece in pieces:
                for headers, payload in framer.feed(piece):
                    event = decode_message(headers, payload)
                    assert event is not None
                    records += len(event)
        else:
            buffer = EventStreamBuffer()
            for piece in pieces:
                buffer.add_data(piece)
                for message in buffer:
                    event = decode_message(message.headers, message.payload)
                    assert event is not None
                    records += len(event)
        now = clock()
        if start_count is None:
            if now >= measure_from:
                start_count, measure_from = records, now
        elif now - measure_from >= window.seconds:
            return (records - start_count) / (now - measure_from)


# ---- (d) efo: ShardSubscription + PendingPool + Handoff + a no-op driver ----------------------


class _CountingHandoff(Handoff):
    def __init__(self) -> None:
        super().__init__()
        self.records = 0

    def put(self, chunk: RecordChunk) -> None:
        super().put(chunk)
        self.records += len(chunk)


async def run_efo(endpoint: str, case: Case, window: Window) -> float:
    # efo's defaults (pydantic fills the fields; mypy runs without the pydantic plugin)
    pool_settings = PoolSettings()  # type: ignore[call-arg]
    batch_settings = BatchSettings()  # type: ignore[call-arg]
    subscription_settings = SubscriptionSettings()  # type: ignore[call-arg]
    pool = PendingPool.of(pool_settings)
    handoff = _CountingHandoff()
    ledgers = {shard_id: CheckpointLedger(Position("LATEST")) for shard_id in case.shard_ids}
    loop = asyncio.get_running_loop()

    def on_committed(commits: list[Commit]) -> None:  # the loop thread, as in the coordinator
        for commit in commits:
            if commit.grant is not None:
                pool.release(commit.grant)
            ledgers[commit.shard_id].committed(commit.serial, commit.records)

    stop = threading.Event()

    def drain() -> None:  # the "Spark driver": takes batches, does nothing, acknowledges them
        while not stop.is_set():
            batch = handoff.take_batch(
                batch_settings.max_records, batch_settings.max_bytes, batch_settings.max_wait_s, idle_wait_s=0.1
            )
            if batch:
                loop.call_soon_threadsafe(on_committed, [Commit.of(chunk) for chunk in batch])

    drainer = threading.Thread(target=drain, name="bench-drain", daemon=True)
    drainer.start()
    async with Clients(Endpoints(REGION, endpoint, None)) as clients:
        client = clients.subscriber(subscription_settings.read_timeout_s)
        await client.ensure_room(case.shards)
        tasks = []
        for shard_id in case.shard_ids:
            pool.register(shard_key("bench", shard_id))  # the owner the subscription acquires as
            subscription = ShardSubscription(
                client=client,
                consumer_arn=case.arn,
                stream="bench",
                shard_id=shard_id,
                start=Position("LATEST"),
                pool=pool,
                handoff=handoff,
                progress=ledgers[shard_id],
                settings=subscription_settings,
            )
            tasks.append(asyncio.create_task(subscription.run()))
        try:
            return await _measure_async(lambda: handoff.records, tasks, window)
        finally:
            await _cancel(tasks)
            stop.set()
            handoff.close()
            drainer.join(timeout=5)


# ---- the run -----------------------------------------------------------------------------------


#: Variants that run efo's decoding: with the garbage collector as ``efo run`` sets it (efo.gc_tuning).
#: stock, stock-epoch and boto3 are programs a user would write without efo: CPython's defaults.
EFO_VARIANTS = frozenset({"parse", "parse-efo", "efo-botocore", "efo"})


def _run_one(variant: str, endpoint: str, case: Case, window: Window) -> float:
    if variant in EFO_VARIANTS:
        with gc_tuning.tuned():
            return _run_variant(variant, endpoint, case, window)
    return _run_variant(variant, endpoint, case, window)


def _run_variant(variant: str, endpoint: str, case: Case, window: Window) -> float:
    if variant == "stock":
        return asyncio.run(run_stock(endpoint, case, window))
    if variant == "stock-epoch":
        return asyncio.run(run_stock(endpoint, case, window, epoch_seconds=True))
    if variant == "boto3":
        return run_boto3(endpoint, case, window)
    if variant == "parse":
        return run_parse_limit(case, window)
    if variant == "parse-efo":
        return run_parse_limit(case, window, own_framing=True)
    if variant == "efo-botocore":
        framing, decoder.FRAMING = decoder.FRAMING, "botocore"
        try:
            return asyncio.run(run_efo(endpoint, case, window))
        finally:
            decoder.FRAMING = framing
    return asyncio.run(run_efo(endpoint, case, window))


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=_ints, default=[1, 8, 64, 256], help="comma-separated shard counts")
    parser.add_argument("--record-size", type=_ints, default=[1024, 10240], help="comma-separated record sizes, bytes")
    parser.add_argument(
        "--records-per-event", type=int, default=None, help="default: 100, at most 256 KiB of record data per event"
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the table shows the median")
    parser.add_argument(
        "--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and client to different CPUs")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()

    hermetic_aws_environment()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")
    window = Window(args.warmup, args.seconds)
    cases = [
        Case(shards, size, args.records_per_event or max(1, min(100, 256 * 1024 // size)))
        for size in args.record_size
        for shards in args.shards
    ]

    client_cpu, server_cpu = pin_cpus(args.no_pin)
    server, endpoint = start_synthetic_server(server_cpu)
    results: dict[tuple[int, int, str], list[float]] = {}
    began = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            for case in cases:
                # Rotate the order every repeat so no variant always runs first (or last).
                order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
                for variant in order:
                    rate = _run_one(variant, endpoint, case, window)
                    results.setdefault((case.shards, case.record_bytes, variant), []).append(rate)
                    print(
                        f"  repeat {repeat + 1}: {case.shards:3d} shards {_size(case.record_bytes):>6} "
                        f"{variant:12s} {rate:10,.0f} records/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        server.kill()
        server.wait()
    elapsed = time.perf_counter() - began

    def median(case: Case, variant: str) -> float | None:
        rates = results.get((case.shards, case.record_bytes, variant))
        return statistics.median(rates) if rates else None

    def cell(value: float | None) -> str:
        return f"{value:,.0f}" if value is not None else "-"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    pairs = (
        ("efo", "stock"),
        ("efo", "stock-epoch"),
        ("efo", "boto3"),
        ("efo", "parse"),
        ("efo", "parse-efo"),
        ("efo", "efo-botocore"),
        ("efo-botocore", "stock"),
        ("efo-botocore", "parse"),
    )
    ratios = [(a, b) for a, b in pairs if {a, b} <= set(variants)]
    print(f"command: `{command_line()}`\n")
    tuned = ", ".join(v for v in variants if v in EFO_VARIANTS)
    print(
        f"records/s, median of {args.repeats} interleaved runs of {args.warmup:g} s warm-up + {args.seconds:g} s; "
        f"server pinned to CPU {server_cpu}, client to CPU {client_cpu}; {elapsed:.0f} s in all; "
        f"garbage collector as `efo run` sets it (efo.gc_tuning) for {tuned}, "
        "CPython's defaults for the others\n"
    )
    print(
        "| shards | record | records/event | "
        + " | ".join(LABELS[v] for v in variants)
        + "".join(f" | {a}/{b}" for a, b in ratios)
        + " |"
    )
    print("|---:" * (3 + len(variants) + len(ratios)) + "|")
    cells = []
    for case in cases:
        row = [str(case.shards), _size(case.record_bytes), str(case.records_per_event)]
        row += [cell(median(case, v)) for v in variants]
        row += [ratio(median(case, a), median(case, b)) for a, b in ratios]
        print("| " + " | ".join(row) + " |")
        cells.append(
            {
                "shards": case.shards,
                "record_bytes": case.record_bytes,
                "runs": {v: results.get((case.shards, case.record_bytes, v), []) for v in variants},
                "median": {v: median(case, v) for v in variants},
            }
        )
    write_json(args.json, {"cells": cells})


if __name__ == "__main__":
    main()
