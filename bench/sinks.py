"""Spark-free sinks for ``efo run`` in the benchmarks (``EFO_SINK=arrow:sinks:<function>``, with
bench/ on PYTHONPATH): each gets the batch as a ``pyarrow.Table``, as the README's arrow sink does."""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

LATENCY_FILE_ENV = "BENCH_LATENCY_FILE"  # float32 seconds, one per record, appended
BATCHES_FILE_ENV = "BENCH_BATCHES_FILE"  # one line per batch: commit time (epoch s), records


def discard(table: Any, batch: Any) -> None:
    """Commits at once and keeps nothing: what efo costs, with a sink that costs nothing."""


def latency(table: pa.Table, batch: Any) -> None:
    """Commits at once; records, per record, seconds from its ApproximateArrivalTimestamp to now
    (the commit: the driver acknowledges the batch when this returns), and per batch its size."""
    committed_at = time.time()
    arrivals = table.column("approximate_arrival_timestamp").cast(pa.int64())  # epoch ms
    seconds = pc.divide(pc.subtract(pa.scalar(committed_at * 1000.0), pc.cast(arrivals, pa.float64())), 1000.0)
    with open(os.environ[LATENCY_FILE_ENV], "ab") as out:
        out.write(pc.cast(seconds, pa.float32()).combine_chunks().to_numpy(zero_copy_only=False).tobytes())
    with open(os.environ[BATCHES_FILE_ENV], "a") as out:
        out.write(f"{committed_at:.6f} {table.num_rows}\n")


def stall(table: Any, batch: Any) -> None:
    """Never returns: nothing is ever committed, so the pool fills and stays full."""
    while True:
        time.sleep(3600)


def spark_noop(df: Any, batch: Any) -> None:
    """``handler:sinks:spark_noop``: the batch's DataFrame written to Spark's ``noop`` format, a Spark
    job that reads every row and keeps nothing (what a streaming query's ``format("noop")`` does)."""
    df.write.format("noop").mode("overwrite").save()


spark_noop.rows_in_tasks = True  # type: ignore[attr-defined]  # written, never joined: rows made in the tasks
