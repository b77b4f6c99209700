"""A Spark driver of its own for the restart tests of the efo source: one query from a stream into
``foreachBatch``, which writes each micro-batch's rows to ``<out>/<batch id>-<attempt>.json`` (the
file appears whole or not at all), and can hold a batch after writing it (before Spark commits it)
so that the test kills the driver there.

    python source_driver.py ENDPOINT REGION STREAM CHECKPOINT OUT [--hold BATCH_ID] [--max-records N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")

from pyspark.sql import DataFrame, SparkSession

HELD = "held"  # the file that says the held batch is written and waits


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "region", "stream", "checkpoint", "out"):
        parser.add_argument(name)
    parser.add_argument("--hold", type=int, default=None)
    parser.add_argument("--max-records", default="15")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    attempt = uuid.uuid4().hex[:8]
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def write(df: DataFrame, batch_id: int) -> None:
        rows = [
            {"shard": r.shardId, "seq": r.sequenceNumber, "key": r.partitionKey, "data": bytes(r.data).decode()}
            for r in df.collect()
        ]
        staged = out / f".{batch_id}-{attempt}.tmp"
        staged.write_text(json.dumps(rows))
        staged.rename(out / f"{batch_id:05d}-{time.time_ns()}-{attempt}.json")  # sorts by batch, then time
        if batch_id == args.hold:
            (out / HELD).write_text(str(batch_id))
            time.sleep(600)  # the test kills the driver here: written, not committed

    query = (
        spark.readStream.format("efo")
        .option("streams", args.stream)
        .option("consumerName", "restart-test")
        .option("region", args.region)
        .option("endpoint", args.endpoint)
        .option("startingPosition", "TRIM_HORIZON")
        .option("maxRecordsPerTrigger", args.max_records)
        .option("shardSyncInterval", "1")
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("query.started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
