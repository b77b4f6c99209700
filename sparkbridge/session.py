"""The SparkSession: built once, before any other thread starts (the JVM must not inherit them).

Local by default; with ``spark_remote`` (EFO_SPARK_REMOTE=sc://host:port) a Spark Connect
session, so the batches run on a Spark cluster and this process holds no JVM.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from efo.config import Settings

# Measured on a 2-core machine: these keep a local session lean without changing results.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}


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
    for key, value in {**LOCAL_DEFAULTS, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
