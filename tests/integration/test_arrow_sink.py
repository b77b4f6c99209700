"""``EFO_SINK=arrow:<module>:<function>``: the whole service without a JVM. The function is
handed each batch as a pyarrow.Table of the DataFrame schema; no Spark session is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .ledger_check import Producer, wait_until_all_committed
from .service import SPARK_MARKERS, ServiceRun, arrow_env, create_stream, unique

pytestmark = pytest.mark.integration


def test_an_arrow_sink_gets_every_record_once_in_order_and_no_spark_starts(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("arrow"), unique("app")
    create_stream(kinesis_client, stream, 2)
    producer = Producer(kinesis_client, stream)
    producer.put(200)
    run = ServiceRun(
        arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "sink", initial_position="TRIM_HORIZON"),
        tmp_path / "efo.log",
    ).start()
    run.wait_for_event("service.ready", timeout_s=30)
    producer.put(200)
    verdict = wait_until_all_committed(producer.acknowledged, tmp_path / "sink", timeout_s=60)
    assert run.stop() == 0
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    log = run.log_path.read_text()
    assert not [marker for marker in SPARK_MARKERS if marker in log], "a Spark session was started"
