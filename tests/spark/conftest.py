"""One SparkSession for every Spark test of the run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from sparkbridge.session import LOCAL_DEFAULTS


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The efo source's reader runs in Python processes the JVM starts with its own environment, fixed
    # when the session starts: the local stack's dummy credentials must be there by then.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    builder = SparkSession.builder.master("local[1]").appName("efo-tests")
    # The service's own settings (how batches become DataFrames), then what keeps tests small.
    conf = {
        **LOCAL_DEFAULTS,
        "spark.sql.shuffle.partitions": "1",
        "spark.default.parallelism": "1",
        "spark.driver.memory": "512m",
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
