"""A failing sink on a real SparkSession: the one line names the sink, the Java cause (not py4j's
``An error occurred while calling o89.parquet``) and what to do; a write that fails the same way on
every attempt (a parent that is a file, a scheme Hadoop does not know, a query Spark cannot analyse)
fails at once instead of after every retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from efo.errors import SinkFailed
from sparkbridge.batches import BatchRunner
from sparkbridge.failures import cause_of
from sparkbridge.sinks import BatchInfo, ParquetSink

from .test_batches import Recorder, chunk

pytestmark = pytest.mark.spark

LABEL = "sink (EFO_SINK) = 'parquet:somewhere'"


class Counting:
    """A sink that counts its attempts and hands each to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.attempts = 0

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        self.attempts += 1
        self.inner.write(df, batch)


def failed(spark: SparkSession, sink: Any, *, max_attempts: int = 5) -> tuple[str, list[float]]:
    sleeps: list[float] = []
    runner = BatchRunner(
        spark, sink, max_attempts=max_attempts, retry_backoff_s=0.5, sleep=sleeps.append, labels={"sink": LABEL}
    )
    with pytest.raises(SinkFailed) as info:
        runner.run("b-1", [chunk("s-1", 0, 3)])
    message = str(info.value)
    assert "\n" not in message
    assert "An error occurred while calling" not in message and "Py4JJavaError" not in message
    return message, sleeps


def test_a_parquet_path_under_a_file_fails_at_once_naming_the_java_cause(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    sink = Counting(ParquetSink(f"{tmp_path}/afile/orders"))
    message, sleeps = failed(spark, sink)
    assert sink.attempts == 1 and sleeps == []
    assert message.startswith(f"{LABEL} failed on batch b-1 (attempt 1; not retried: every attempt fails so): ")
    assert "org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory" in message
    assert "afile" in message
    assert message.endswith(
        "a part of the path is a file, not a directory: give the sink a path whose parents are "
        "directories; its records will be read again"
    )


def test_an_s3_uri_fails_at_once_and_says_to_use_s3a(spark: SparkSession) -> None:
    sink = Counting(ParquetSink("s3://bucket/orders"))
    message, sleeps = failed(spark, sink)
    assert sink.attempts == 1 and sleeps == []
    assert 'org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "s3"' in message
    assert "s3a://" in message


class Unanalysable:
    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        df.select("no_such_column").collect()


def test_a_query_spark_cannot_analyse_fails_at_once(spark: SparkSession) -> None:
    sink = Counting(Unanalysable())
    message, sleeps = failed(spark, sink)
    assert sink.attempts == 1 and sleeps == []
    assert "no_such_column" in message and "AnalysisException" in message
    assert "DataFrame schema" in message


def test_a_failure_a_retry_may_cure_is_retried_and_named_with_its_cause(spark: SparkSession) -> None:
    sink = Recorder(fail_times=99)
    message, sleeps = failed(spark, sink, max_attempts=3)
    assert len(sink.calls) == 3 and sleeps == [0.5, 1.0]
    assert message == (
        f"{LABEL} failed on batch b-1 after 3 attempts: OSError: sink down (attempt 3); fix the sink (its path, "
        "permissions, the target's schema) and start again; its records will be read again"
    )


def test_a_job_that_aborts_is_named_by_its_innermost_java_cause(spark: SparkSession, tmp_path: Path) -> None:
    try:
        spark.range(1).write.mode("overwrite").parquet("/proc/efo-cannot-mkdir/orders")
    except Exception as exc:  # Py4JJavaError: SparkException (job aborted) caused by an IOException
        cause = cause_of(exc)
    else:
        pytest.fail("a write under /proc succeeded")
    assert cause.kind == "java.io.IOException" and cause.message.startswith("Mkdirs failed to create")
    assert not cause.permanent


@pytest.mark.integration
def test_a_sink_path_that_cannot_be_written_is_refused_before_a_consumer_or_table_is_made(
    spark: SparkSession,
    local_stack: Any,
    kinesis_client: Any,
    dynamodb_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start on a real session and the local stack: the stream is there, the consumer and the
    table are not; a sink under a file is refused (exit 2) and neither is made. (efo run's own
    order, Spark started after the read-only checks, is tests/unit/test_app_start.py's.)"""
    from efo.config import load_settings
    from efo.errors import EXIT_CONFIG, ConfigError
    from sparkbridge.app import run_with_session
    from tests.integration.service import create_stream, unique

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # the local stack's dummy credentials
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    stream, app = unique("unwritable"), unique("app")
    create_stream(kinesis_client, stream, 1)
    (tmp_path / "afile").write_text("a file, not a directory")
    sink = f"parquet:{tmp_path}/afile/orders"
    settings = load_settings(
        stream=stream,
        app=app,
        sink=sink,
        region=local_stack.region,
        kinesis_endpoint=local_stack.kinesis_endpoint,
        dynamodb_endpoint=local_stack.dynamodb_endpoint,
    )
    with pytest.raises(ConfigError) as refused:
        run_with_session(spark, settings)
    message = str(refused.value)
    assert refused.value.exit_code == EXIT_CONFIG and "\n" not in message
    assert message.startswith(f"sink (EFO_SINK) = {sink!r}: cannot write under {tmp_path}/afile/orders: ")
    assert "org.apache.hadoop.fs.ParentNotDirectoryException" in message and "a part of the path is a file" in message
    stream_arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    assert kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"] == []
    assert app not in dynamodb_client.list_tables()["TableNames"]
