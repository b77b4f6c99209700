"""The SparkSession: built once, before any other thread starts (the JVM must not inherit them).

Local by default; with ``spark_remote`` (EFO_SPARK_REMOTE=sc://host:port) a Spark Connect
session, so the batches run on a Spark cluster and this process holds no JVM.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from efo.config import Settings
from efo.errors import ConfigError
from efo.stderr_json import child_stderr_as_json, wants_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Measured on a 2-core machine: these keep a local session lean without changing results.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # C1 only: C2 cost 0.10-0.13 CPU-s per 10,000 records of JIT in a service's first minute. G1
    # regions of 32 MiB instead of 1 MiB (G1's choice at a 1-2 GiB heap, where the Arrow batches'
    # large byte arrays are humongous objects): G1's threads went from 0.021-0.030 to 0.004-0.011
    # CPU-s per 10,000 records (bench/service_cpu.py, Parquet sink, 4 runs against 4).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:G1HeapRegionSize=32m",
}

#: log4j2 configuration of the JVM when efo logs JSON: the JVM's lines are JSON objects too.
LOG4J2_JSON = Path(__file__).with_name("log4j2-json.properties")


def build_session(settings: Settings, app_name: str = "efo") -> SparkSession:
    # Here, not at the top: the arrow sink's path imports this module, starts no session and so
    # loads no pyspark (0.1 CPU-s and 8 MiB less a process).
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ConfigError(
            f"a Spark session needs pyspark, which does not import: {exc}; install efo with its spark extra "
            "(pip install 'efo[spark]')"
        ) from None
    conf = dict(settings.spark.conf)
    if settings.spark_remote:
        builder = SparkSession.builder.remote(settings.spark_remote).appName(app_name)
        for key, value in {"spark.sql.session.timeZone": "UTC", **conf}.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(settings.spark.master)
    json_logs = wants_json(settings.log.format)
    conf = {**LOCAL_DEFAULTS, **conf}
    java_options = conf["spark.driver.extraJavaOptions"]
    if json_logs and "log4j2.configurationFile" not in java_options:  # a configuration of your own wins
        conf["spark.driver.extraJavaOptions"] = f"{java_options} -Dlog4j2.configurationFile={LOG4J2_JSON}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    # The JVM's own lines (start-up warnings, a crash) bypass log4j2: they are wrapped into JSON.
    with child_stderr_as_json("jvm") if json_logs else nullcontext():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


#: Below this size (48 MiB by default) ``createDataFrame(arrow table)`` makes a local relation: the
#: JVM converts the batch to rows on the driver and ships them inside each task, every row copied,
#: serialized and deserialized again. At 0 the Arrow batches go to the tasks as they are and are
#: converted there: half the JVM's CPU per 32,000-row batch of 1 KiB records, a quarter of it in
#: garbage collection before (JFR and /proc, PySpark 4.3, local[2]). But a local relation has a
#: known size, so that joins broadcast it; converted in the tasks Spark knows none.
LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
#: Rows per Arrow batch sent to the JVM: converted in the tasks, each Arrow batch is one partition.
MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: The most bytes of one Arrow batch: each travels inside its task, and a task over
#: ``spark.rpc.message.maxSize`` (128 MiB by default) fails on a cluster.
ARROW_BATCH_MAX_BYTES = 64 * 1024 * 1024


def dataframe_of(spark: SparkSession, table: pa.Table, *, rows_in_tasks: bool) -> DataFrame:
    """``spark.createDataFrame(table)``; with ``rows_in_tasks`` (and a classic session, local or
    on a cluster) the rows are made from Arrow in the tasks, one Arrow batch (one partition, one
    file of a writing sink) for each of the session's default partitions, as a local relation
    would have it, and none over :data:`ARROW_BATCH_MAX_BYTES`. The two settings are set on the
    session for this call (they are read in it) and put back: a thread of your own using the
    session meanwhile would see them. Spark Connect sends the table its own way: nothing changes."""
    if not rows_in_tasks or _is_connect(spark) or not table.num_rows:
        return spark.createDataFrame(table)
    rows = table.num_rows
    per_partition = math.ceil(rows / max(1, spark.sparkContext.defaultParallelism))
    per_batch = max(1, min(per_partition, rows * ARROW_BATCH_MAX_BYTES // max(1, table.nbytes)))
    settings = {LOCAL_RELATION_THRESHOLD: "0", MAX_RECORDS_PER_BATCH: str(per_batch)}
    with ExitStack() as restore:  # every setting is put back, even if another fails to be
        for key, value in settings.items():
            previous = spark.conf.get(key)
            if previous is None:
                restore.callback(spark.conf.unset, key)
            else:
                restore.callback(spark.conf.set, key, previous)
            spark.conf.set(key, value)
        return spark.createDataFrame(table)


def _is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
