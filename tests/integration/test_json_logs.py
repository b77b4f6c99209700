"""With JSON logs, every line ``efo run`` writes to standard error is a JSON object: its own
structlog lines, the JVM's log4j2 lines and the JVM's own start-up warnings, and the final
``efo: ...`` line. The run is the s3a pre-flight refusal: the JVM starts, no record is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG

from .service import create_stream, efo, put_records, service_env, unique

pytestmark = pytest.mark.integration


def test_an_s3a_sink_without_hadoop_aws_stops_before_reading_and_every_stderr_line_is_json(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("s3a")
    create_stream(kinesis_client, stream, 1)
    put_records(kinesis_client, stream, 20, tag="never-read")
    env = service_env(
        local_stack, stream=stream, app=unique("app"), output=tmp_path / "unused", initial_position="TRIM_HORIZON"
    )
    env["EFO_SINK"] = "parquet:s3a://lake/orders"
    result = efo(env, "run")
    assert result.code == EXIT_CONFIG, result.stderr
    lines = result.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # raises on the first line that is not JSON
    assert all({"timestamp", "level", "logger", "event"} <= set(e) for e in events), lines
    loggers = {e["logger"] for e in events}
    assert "jvm" in loggers, lines  # the JVM's own lines, wrapped
    assert any(name.startswith("org.apache.") for name in loggers), lines  # log4j2's JSON layout
    final = events[-1]
    assert final["level"] == "error" and final["logger"] == "stderr"
    assert final["event"].startswith("efo: sink (EFO_SINK) = 'parquet:s3a://lake/orders': ")
    assert "hadoop-aws-" in final["event"] and "spark.jars.packages=org.apache.hadoop:hadoop-aws:" in final["event"]
    names = [e["event"] for e in events]
    assert "consumer.active" not in names and "shard.started" not in names and "subscription.started" not in names
    assert result.stdout == ""
