"""``make demo-stream``: efo as a Structured Streaming source, end to end on the local stack.

A job you would write yourself: ``spark.readStream.format("efo")`` (found by name, no JAR) into
Parquet, and beside it a windowed count per key with a watermark, in the same session. It starts the
local stack, creates a 4-shard stream and produces JSON records while splitting a shard; the query
reads them with ``processingTime("1 second")``. Then it stops the query, produces more while it is
down, and runs it again from its checkpoint with ``Trigger.AvailableNow``, which reads what is left
and stops on its own. The last line is ``demo-stream: produced=P consumed=C lost=L duplicates=D``;
exit 1 when L > 0.

Against AWS, only the options change: drop ``endpoint``, set ``region``, and name your stream and a
consumer of its own for the query.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from efo.devstack.producer import kinesis_client, put_all, wait_active
from efo.devstack.stack import LocalStack

STREAM = "efo-demo-stream"


def produce(kinesis: Any, count: int, first: int = 0, *, split: bool = False) -> set[tuple[str, str]]:
    """Put ``count`` JSON records ``{"n", "key", "id"}``, splitting a shard half-way if asked."""

    def entries(lo: int, hi: int) -> list[dict[str, Any]]:
        return [
            {
                "Data": f'{{"n": {n}, "key": "key-{n % 7}", "id": "{uuid.uuid4()}"}}'.encode(),
                "PartitionKey": f"key-{n % 97}",
            }
            for n in range(lo, hi)
        ]

    half = first + count // 2
    acknowledged = put_all(kinesis, STREAM, entries(first, half))
    if split:
        shard = kinesis.list_shards(StreamName=STREAM)["Shards"][0]
        low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(StreamName=STREAM, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2))
        print(f"demo-stream: split {shard['ShardId']} while the query reads", flush=True)
        wait_active(kinesis, STREAM)
    acknowledged += put_all(kinesis, STREAM, entries(half, first + count))
    return {(put.shard_id, put.sequence_number) for put in acknowledged}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records",
        type=int,
        default=2000,
        help="records produced while the query runs (and half as many while it is down)",
    )
    parser.add_argument("--timeout-s", type=float, default=240.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="efo-demo-stream-"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")  # the local stack takes any credentials
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")

    with LocalStack(log_dir=workdir / "stack-logs") as endpoints:
        print(f"demo-stream: local stack up: kinesis {endpoints.kinesis_endpoint}", flush=True)
        kinesis = kinesis_client(endpoints.kinesis_endpoint, endpoints.region)
        kinesis.create_stream(StreamName=STREAM, ShardCount=4)
        wait_active(kinesis, STREAM)

        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("efo-demo-stream")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")

        def source(consumer: str) -> Any:
            return (
                spark.readStream.format("efo")
                .option("streams", STREAM)
                .option("consumerName", consumer)  # each query its own: they would take the shards from each other
                .option("region", endpoints.region)
                .option("endpoint", endpoints.kinesis_endpoint)
                .option("startingPosition", "TRIM_HORIZON")
                .option("maxRecordsPerTrigger", "1000")
                .load()
            )

        raw, checkpoint = workdir / "raw", workdir / "checkpoint"

        def to_parquet(df: Any) -> Any:
            return (
                df.writeStream.format("parquet").option("path", str(raw)).option("checkpointLocation", str(checkpoint))
            )

        lake = source("demo-stream-lake")

        def parquet_rows() -> int:  # the file sink's own log says which files are whole
            return spark.read.schema(lake.schema).parquet(str(raw)).count() if (raw / "_spark_metadata").exists() else 0

        events = source("demo-stream-counts").withColumn(
            "payload", F.from_json(F.col("data").cast("string"), "n LONG, key STRING, id STRING")
        )
        query = to_parquet(lake).trigger(processingTime="1 second").start()
        counts = (
            events.withWatermark("approximateArrivalTimestamp", "30 seconds")
            .groupBy(F.window("approximateArrivalTimestamp", "10 seconds"), F.col("payload.key"))
            .count()
            .writeStream.format("memory")
            .queryName("per_key")
            .outputMode("complete")
            .option("checkpointLocation", str(workdir / "counts-checkpoint"))
            .trigger(processingTime="2 seconds")
            .start()
        )
        print("demo-stream: two queries started (Parquet, and a windowed count per key)", flush=True)
        produced: set[tuple[str, str]] = set()
        producer = threading.Thread(target=lambda: produced.update(produce(kinesis, args.records, split=True)))
        producer.start()
        deadline = time.monotonic() + args.timeout_s
        producer.join(args.timeout_s)
        while parquet_rows() < len(produced) and time.monotonic() < deadline and query.exception() is None:
            time.sleep(1.0)
        print(f"demo-stream: {parquet_rows()} rows in Parquet; the query stops", flush=True)
        query.stop()
        counts.stop()
        spark.sql("SELECT key, sum(count) AS records FROM per_key GROUP BY key ORDER BY key").show()

        produced |= produce(kinesis, args.records // 2, first=args.records)
        print("demo-stream: produced more while it was down; Trigger.AvailableNow from the checkpoint", flush=True)
        again = to_parquet(source("demo-stream-lake")).trigger(availableNow=True).start()
        finished = again.awaitTermination(args.timeout_s)
        print(f"demo-stream: AvailableNow {'stopped on its own' if finished else 'did not stop in time'}", flush=True)
        if not finished:
            again.stop()

        df = spark.read.parquet(str(raw))
        rows = df.count()
        keys = {(r.shardId, r.sequenceNumber) for r in df.select("shardId", "sequenceNumber").collect()}
        for row in df.groupBy("shardId").count().orderBy("shardId").collect():
            print(f"demo-stream:   {row.shardId}: {row['count']} rows")
        spark.stop()
    lost = len(produced - keys)
    print(f"demo-stream: output in {raw}")
    print(f"demo-stream: produced={len(produced)} consumed={len(keys)} lost={lost} duplicates={rows - len(keys)}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
