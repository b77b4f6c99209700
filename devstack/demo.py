"""``make demo``: the whole path on the local stack, end to end.

Starts the local stack, creates a 4-shard stream, runs ``efo run`` with TRIM_HORIZON into Parquet,
produces synthetic records while splitting a shard, waits until everything produced is in the
output, stops the service and the stack, and prints a summary computed with Spark. The last line
on standard output is ``demo: produced=P consumed=C lost=L duplicates=D``; exit 1 when L > 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from efo.devstack.producer import kinesis_client, put_all, wait_active
from efo.devstack.stack import LocalStack, die_with_parent_process

STREAM = "efo-demo"


def produce(kinesis: Any, stream: str, count: int, *, split_after: int | None) -> set[tuple[str, str]]:
    """Put ``count`` records, splitting a shard after ``split_after``; returns the (shard, sequence
    number) pairs Kinesis acknowledged."""

    def entries(first: int, last: int) -> list[dict[str, Any]]:
        return [
            {"Data": f'{{"n": {n}, "id": "{uuid.uuid4()}"}}'.encode(), "PartitionKey": f"key-{n % 97}"}
            for n in range(first, last)
        ]

    half = count if split_after is None else min(split_after, count)
    acknowledged = put_all(kinesis, stream, entries(0, half))
    if split_after is not None:
        shard = kinesis.list_shards(StreamName=stream)["Shards"][0]
        low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(StreamName=stream, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2))
        print(f"demo: split {shard['ShardId']} after {half} records", flush=True)
        wait_active(kinesis, stream)
    acknowledged += put_all(kinesis, stream, entries(half, count))
    return {(put.shard_id, put.sequence_number) for put in acknowledged}


def output_rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        return ds.dataset(str(path), format="parquet", partitioning="hive", exclude_invalid_files=True).count_rows()
    except (OSError, ValueError):  # a batch being committed right now
        return 0


def summarize_with_spark(path: Path, produced: set[tuple[str, str]]) -> tuple[int, int, int]:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("efo-demo-summary")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = spark.read.parquet(str(path))
        rows = df.count()
        keys = df.select("shard_id", "sequence_number", "sub_sequence_number").distinct()
        consumed = keys.count()
        seen = {(r.shard_id, r.sequence_number) for r in keys.select("shard_id", "sequence_number").collect()}
        per_shard = df.groupBy("shard_id").count().orderBy("shard_id").collect()
        for row in per_shard:
            print(f"demo:   {row.shard_id}: {row['count']} rows")
    finally:
        spark.stop()
    return consumed, len(produced - seen), rows - consumed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--output", type=Path, default=None, help="Parquet output directory (default: a temp dir)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="efo-demo-"))
    output = args.output or workdir / "parquet"

    with LocalStack(log_dir=workdir / "stack-logs") as endpoints:
        print(f"demo: local stack up: kinesis {endpoints.kinesis_endpoint}, dynamodb {endpoints.dynamodb_endpoint}")
        kinesis = kinesis_client(endpoints.kinesis_endpoint, endpoints.region)
        kinesis.create_stream(StreamName=STREAM, ShardCount=4)
        wait_active(kinesis, STREAM)
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "demo",
            "AWS_SECRET_ACCESS_KEY": "demo",
            "EFO_STREAM": STREAM,
            "EFO_APP": "efo-demo",
            "EFO_INITIAL_POSITION": "TRIM_HORIZON",
            "EFO_SINK": f"parquet:{output}",
            "EFO_REGION": endpoints.region,
            "EFO_KINESIS_ENDPOINT": endpoints.kinesis_endpoint,
            "EFO_DYNAMODB_ENDPOINT": endpoints.dynamodb_endpoint,
            "EFO_BATCH__MAX_WAIT_S": "2",
            "EFO_CHECKPOINT__INTERVAL_S": "1",
            "EFO_SHARDS__SYNC_INTERVAL_S": "2",
        }
        log_path = workdir / "efo-run.log"
        with log_path.open("wb") as log:
            service = subprocess.Popen(
                [sys.executable, "-m", "efo.cli", "run"],
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent_process,
            )
        print(f"demo: efo run started (pid {service.pid}, log {log_path})", flush=True)
        try:
            produced = produce(kinesis, STREAM, args.records, split_after=args.records // 2)
            print(f"demo: produced {len(produced)} records", flush=True)
            deadline = time.monotonic() + args.timeout_s
            while output_rows(output) < len(produced) and time.monotonic() < deadline:
                if service.poll() is not None:
                    print(f"demo: efo run exited early with {service.returncode}; see {log_path}")
                    break
                time.sleep(1.0)
        finally:
            if service.poll() is None:
                service.send_signal(signal.SIGTERM)
                try:
                    service.wait(60)
                except subprocess.TimeoutExpired:
                    service.kill()
                    service.wait()
        print(f"demo: efo run stopped with exit code {service.returncode}", flush=True)
    print("demo: local stack stopped", flush=True)

    consumed, lost, duplicates = summarize_with_spark(output, produced) if output.exists() else (0, len(produced), 0)
    print(f"demo: output in {output}")
    print(f"demo: produced={len(produced)} consumed={consumed} lost={lost} duplicates={duplicates}")
    return 1 if lost > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
