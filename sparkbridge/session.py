"""The SparkSession: built once, before any other thread starts (the JVM must not inherit them).

Local by default; with ``spark_remote`` (EFO_SPARK_REMOTE=sc://host:port) a Spark Connect
session, so the batches run on a Spark cluster and this process holds no JVM.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path

from pyspark.sql import SparkSession

from efo.config import Settings
from efo.stderr_json import child_stderr_as_json, wants_json

# Measured on a 2-core machine: these keep a local session lean without changing results.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # createDataFrame(arrow table): under this size (48 MiB by default) the JVM converts the batch
    # to rows on the driver and ships them inside each task (a local relation): every row copied,
    # serialized and deserialized again. At 0 the Arrow batches go to the tasks as they are and are
    # converted there: half the JVM's CPU per 32,000-row batch of 1 KiB records, a fifth of its
    # garbage-collection time (measured with JFR and /proc, PySpark 4.3, local[2]).
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}

#: log4j2 configuration of the JVM when efo logs JSON: the JVM's lines are JSON objects too.
LOG4J2_JSON = Path(__file__).with_name("log4j2-json.properties")


def build_session(settings: Settings, app_name: str = "efo") -> SparkSession:
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
