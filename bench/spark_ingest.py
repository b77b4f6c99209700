"""Rows/s of the whole Spark bridge against Spark alone ingesting the identical Arrow tables.

Bridge (timed): ``BatchRunner.commit`` (``createDataFrame``, sink write) -> the chunks' pool
grants released on the asyncio loop thread (what ``Service.commit`` ends in), while the next batch
goes through ``Handoff.take_batch`` -> ``BatchRunner.prepare`` (watermark, ``to_table``) on the
prefetch thread: a driver that is behind, in its steady state (:func:`time_bridge`). Spark alone
(timed): ``createDataFrame(table)`` (made as the bridge makes it) + the same sink write, on tables
built by ``to_table`` from the same chunks outside the timed region.

Chunks (1 KiB random records as the subscription hands them over: lists of sequence numbers, keys
and arrival times, the payloads as bytes, as the decoder leaves them) and their pool grants are built before any
timing. The two variants run interleaved (alternating which goes first), after one untimed
warm-up each; the overhead is the median of the repeats' ratios (:func:`_overhead`), printed with their
middle half.

    .venv/bin/python bench/spark_ingest.py [--sizes 10000,100000] [--repeats 5] [--sinks parquet,noop]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import command_line, write_json
from pyspark.sql import DataFrame, SparkSession

from efo.config import load_settings
from efo.kinesis.columns import ReusableBlocks
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import Grant, PendingPool
from efo.pipeline.records import RecordChunk, Row
from sparkbridge.arrow import to_table
from sparkbridge.batches import BatchRunner, DeliveryWatermark, Prefetcher, PreparedBatch
from sparkbridge.session import build_session, dataframe_of
from sparkbridge.sinks import BatchInfo, ParquetSink, Sink, SinkCapabilities, rows_in_tasks

SEQUENCE_BASE = 49_590_338_271_490_256_608_559_692_538_361_571_095_921_575_989_136_588_898  # 56 digits, like Kinesis


class NoopSink:
    """Materializes every row and column in Spark, writes nothing; its batches are made as the
    Parquet sink's are (sparkbridge.session.dataframe_of), so it shows that path without the writing."""

    capabilities = SinkCapabilities(rows_in_tasks=True)

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        df.write.format("noop").mode("overwrite").save()


def build_chunks(records: int, chunk_records: int, record_bytes: int, shards: int) -> list[RecordChunk]:
    """Chunks as the subscription hands them over: lists of sequence numbers, keys, arrival times
    and payloads (bytes), so the bridge's conversion is part of what is timed."""
    chunks: list[RecordChunk] = []
    serials = [0] * shards
    for start in range(0, records, chunk_records):
        shard = (start // chunk_records) % shards
        serials[shard] += 1
        rows = (
            Row(str(SEQUENCE_BASE + i), os.urandom(record_bytes), f"pk-{i % 64}", 1_700_000_000_000 + i)
            for i in range(start, min(records, start + chunk_records))
        )
        chunks.append(RecordChunk.of_rows("bench", f"shardId-{shard:012d}", serials[shard], rows))
    return chunks


class LoopThread:
    """An asyncio loop on its own thread holding the PendingPool, as the service thread does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = PendingPool(10**12, 10**15)
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-loop", daemon=True)
        self._thread.start()

    def grant(self, chunks: list[RecordChunk]) -> None:
        for c in chunks:
            c.grant = asyncio.run_coroutine_threadsafe(
                self.pool.acquire(len(c), c.data_bytes, c.shard_id), self.loop
            ).result()

    def release(self, chunks: list[RecordChunk]) -> None:
        """Hand the grants to the loop (Service.commit) and wait until it has released them."""
        grants: list[Grant] = [c.grant for c in chunks]
        done: Future[None] = Future()

        def release_all() -> None:
            for g in grants:
                self.pool.release(g)
            done.set_result(None)

        self.loop.call_soon_threadsafe(release_all)
        done.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


def time_bridge(runner: BatchRunner, batches: list[list[RecordChunk]], loop: LoopThread, batch_id: str) -> float:
    """Seconds per batch of a driver that is behind (the only time the bridge's cost limits what
    it carries): every timed batch is committed while the next one is taken and prepared
    (watermark, Arrow) on the prefetch thread. So the first batch is prepared before the clock
    starts, as the batch before it would have left it, and the last one is prepared beside the
    last timed commit but not committed: ``batches`` holds one batch more than it times. The
    runner lives across runs, as the driver's does (its payload blocks already grown)."""
    chunks = [c for batch in batches for c in batch]
    loop.grant(chunks)
    handoff = Handoff()
    for c in chunks:
        handoff.put(c)
    runner.watermark = DeliveryWatermark()  # the same chunks again
    rows = sum(len(c) for c in batches[0])
    numbers = itertools.count()

    def take_and_prepare(turn: Callable[[], bool]) -> PreparedBatch | None:
        taken = handoff.take_batch(rows, 10**15, 0.0, idle_wait_s=0.0)
        return runner.prepare(f"{batch_id}-{next(numbers)}", taken) if taken and turn() else None

    prefetch = Prefetcher(take_and_prepare)
    try:
        prepared = prefetch.next()
        started = time.perf_counter()
        for _ in batches[1:]:
            assert prepared is not None
            result = runner.commit(prepared, frame_ready=prefetch.start_next)
            loop.release(result.chunks)
            prepared = None  # as the driver lets go of it: its payload block is free for the batch after next
            prepared = prefetch.next()
        elapsed = time.perf_counter() - started
        assert prepared is not None
        loop.release(prepared.chunks)  # prepared beside the last commit; not timed any further
    finally:
        prefetch.close()
    assert loop.pool.records == 0
    return elapsed / (len(batches) - 1)


def time_spark(spark: SparkSession, sink: Sink, tables: list[Any], info: BatchInfo) -> float:
    """Seconds per batch of Spark alone on the identical Arrow tables (built before timing)."""
    started = time.perf_counter()
    for table in tables:
        sink.write(dataframe_of(spark, table, rows_in_tasks=rows_in_tasks(sink)), info)
    return (time.perf_counter() - started) / len(tables)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="batch sizes in rows, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant, size and sink")
    parser.add_argument("--batches", type=positive, default=3, help="consecutive batches per timed run, at least")
    parser.add_argument(
        "--run-rows",
        type=int,
        default=300_000,
        help="rows per timed run, at least (more batches of a small size: a run of 3 batches of 10,000 rows "
        "lasts 0.15 s, and a single slow Spark job moved the figure by 20 points)",
    )
    parser.add_argument("--sinks", default="parquet,noop", help="parquet and/or noop")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--chunk-records", type=int, default=500, help="records per chunk (one SubscribeToShard event)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    # 2g ran the JVM out of heap twice on the no-op sink at 100,000 rows (dispatcher-event-loop:
    # OutOfMemoryError serializing a task), after which Spark made no progress: batches of 100 MB
    # are past batch.max_bytes's default, and this machine has the memory.
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--out", default=None, help="parquet output directory (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    sinks = [s.strip() for s in args.sinks.split(",")]

    settings = load_settings(
        stream="bench",
        app="bench",
        sink="console",
        spark={"master": args.master, "conf": {"spark.driver.memory": args.driver_memory}},
    )
    spark = build_session(settings, app_name="efo-bench")
    spark.sparkContext.setLogLevel("ERROR")
    spark_version = spark.version
    per_run = {size: max(args.batches, -(-args.run_rows // size)) for size in sizes}  # batches per timed run
    # The bridge's runs take one batch more than they time (time_bridge).
    chunks = build_chunks(
        max(size * (per_run[size] + 1) for size in sizes), args.chunk_records, args.record_bytes, args.shards
    )
    loop = LoopThread()
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="efo-bench-"))

    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    python_side: dict[int, tuple[float, float]] = {}
    try:
        for size in sizes:
            batches = _consecutive(chunks, size, per_run[size] + 1)
            batch = batches[0]
            tables = [to_table(b) for b in batches[: per_run[size]]]
            info = BatchInfo("bench", size, sum(c.data_bytes for c in batch))
            python_side[size] = (
                _median_s(partial(to_table, batch, ReusableBlocks(2)), args.repeats),
                _median_s(partial(_filter_all, batch), args.repeats),
            )
            for sink_name in sinks:
                bridge_sink, spark_sink = (
                    _sink(sink_name, work / f"bridge-{size}"),
                    _sink(sink_name, work / f"spark-{size}"),
                )
                runs = {
                    "bridge": partial(
                        time_bridge,
                        BatchRunner(spark, bridge_sink, max_attempts=1, retry_backoff_s=0),
                        batches,
                        loop,
                        "bench",
                    ),
                    "spark": partial(time_spark, spark, spark_sink, tables, info),
                }
                times: dict[str, list[float]] = {"bridge": [], "spark": []}
                for repeat in range(args.repeats + 1):  # repeat 0 is the warm-up
                    for variant in ("bridge", "spark") if repeat % 2 else ("spark", "bridge"):
                        elapsed = runs[variant]()
                        if repeat:
                            times[variant].append(elapsed)
                results[(sink_name, size)] = times
                b, s = statistics.median(times["bridge"]), statistics.median(times["spark"])
                print(
                    f"  {sink_name:8} {size:>7} rows: bridge {b:.3f} s, spark alone {s:.3f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        loop.close()
        spark.stop()

    print(f"command: `{command_line()}`\n")
    print(
        f"{args.repeats} repeats of "
        + ", ".join(f"{count} consecutive batches of {size:,} rows" for size, count in per_run.items())
        + "; medians of seconds per batch; overhead: "
        "the median of each repeat's bridge run against its Spark-alone run (run beside it, in alternating order); "
        f"{args.record_bytes} B records, {args.chunk_records} records/chunk, "
        f"{args.shards} shards, master {args.master}, driver memory {args.driver_memory}\n"
    )
    print(
        "| sink | batch rows | bridge rows/s | Spark alone rows/s | bridge s | Spark s | overhead "
        "| middle half of the repeats |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (sink_name, size), times in results.items():
        b, s = statistics.median(times["bridge"]), statistics.median(times["spark"])
        low, high = _overhead_quartiles(times)
        print(
            f"| {sink_name} | {size:,} | {size / b:,.0f} | {size / s:,.0f} | {b:.3f} | {s:.3f} "
            f"| {_overhead(times):+.1%} | {low:+.0%} to {high:+.0%} |"
        )
    print("\nThe bridge's own Python work per batch (medians, measured apart from the runs above):\n")
    print("| batch rows | to_table s | watermark filter s |")
    print("|---:|---:|---:|")
    for size, (table_s, watermark_s) in python_side.items():
        print(f"| {size:,} | {table_s:.3f} | {watermark_s:.3f} |")
    write_json(
        args.json,
        {
            "cases": [
                {
                    "sink": sink_name,
                    "rows": size,
                    **times,
                    "overhead": _overhead(times),
                    "overhead_quartiles": _overhead_quartiles(times),
                }
                for (sink_name, size), times in results.items()
            ],
            "spark_version": spark_version,
        },
    )
    return 0


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 1")
    return number


def _overhead(times: dict[str, list[float]]) -> float:
    """The median over the repeats of each bridge run against the Spark-alone run beside it: the
    machine's speed drifts between repeats (Spark alone's own time by a third in one run), which
    a ratio of the two medians carries into the figure and a ratio per repeat cancels."""
    return statistics.median(b / s for b, s in zip(times["bridge"], times["spark"], strict=True)) - 1


def _overhead_quartiles(times: dict[str, list[float]]) -> tuple[float, float]:
    """The first and third quartiles of the repeats' ratios (:func:`_overhead` is their median):
    how far one repeat's figure wanders, which decides how many repeats a verdict needs."""
    ratios = [b / s - 1 for b, s in zip(times["bridge"], times["spark"], strict=True)]
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    # Below 4 repeats the default (exclusive) method reaches past the figures themselves.
    quartiles = statistics.quantiles(ratios, n=4, method="exclusive" if len(ratios) >= 4 else "inclusive")
    return quartiles[0], quartiles[2]


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _sink(name: str, path: Path) -> Sink:
    return ParquetSink(str(path)) if name == "parquet" else NoopSink()


def _filter_all(chunks: list[RecordChunk]) -> None:
    watermark = DeliveryWatermark()
    for c in chunks:
        watermark.filter(c)


def _consecutive(chunks: list[RecordChunk], rows: int, count: int) -> list[list[RecordChunk]]:
    """``count`` batches of ``rows`` rows each, from the front of ``chunks``."""
    per_batch = rows // len(chunks[0])
    assert per_batch * len(chunks[0]) == rows, "batch sizes must be multiples of --chunk-records"
    return [chunks[i * per_batch : (i + 1) * per_batch] for i in range(count)]


if __name__ == "__main__":
    sys.exit(main())
