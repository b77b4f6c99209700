"""The Spark source's reader (pyspark_efo.reader) against pyspark's own reader process code
(pyspark.sql.streaming.python_streaming_source_runner), with a fake engine and no JVM.

The reader subclasses pyspark's private ``_SimpleStreamReaderWrapper`` so that the reader process
sends the batches planned in ``latestOffset`` with the plan (the prefetched path) while taking Spark's
read limits; these tests pin what that relies on in the pinned pyspark (pyproject.toml): the flags
the runner derives from the reader's classes, the read limit as the runner serializes it, the
limit handed to ``latestOffset``, the prefetched batches sent by ``partitions`` (and none for a range
this process did not plan: Spark's executor reads it again), and AvailableNow's preparation."""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

import pyarrow as pa
from pyspark.serializers import SpecialLengths, read_int, write_with_length
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import python_streaming_source_runner as runner

from efo.pipeline.records import RecordChunk, Row
from efo.source.engine import Planned, initial_offset
from efo.source.options import parse
from pyspark_efo import DefaultSource
from pyspark_efo.reader import EfoStreamReader
from pyspark_efo.schema import ARROW_SCHEMA, SCHEMA

OPTIONS = {"streams": "orders", "consumerName": "c", "maxRecordsPerTrigger": "25"}
END = {"v": 1, "streams": {"arn:aws:kinesis:eu-west-1:123456789012:stream/orders": {"stream": "orders"}}}


class Engine:
    """What the reader asks of efo.source.engine.Engine: a plan from a start, up to limits."""

    def __init__(self) -> None:
        self.available_now_at_ms: int | None = None
        self.asked: list[tuple[dict[str, Any], int | None, int | None]] = []
        self.closed = False

    def plan(self, start: dict[str, Any], max_rows: int | None = None, max_bytes: int | None = None) -> Planned:
        self.asked.append((start, max_rows, max_bytes))
        rows = [Row(str(seq), f"r{seq}".encode(), f"k{seq}", 1_000 + seq) for seq in (1, 2, 3)]
        return Planned([RecordChunk.of_rows("orders", "shardId-000000000000", 1, rows)], END, advanced=True)

    def close(self) -> None:
        self.closed = True


def reader() -> tuple[EfoStreamReader, Engine]:
    made = EfoStreamReader(parse(OPTIONS))
    made._engine = engine = Engine()  # type: ignore[assignment]
    return made, engine


def sent(*texts: str) -> io.BytesIO:
    infile = io.BytesIO()
    for text in texts:
        write_with_length(text.encode(), infile)
    infile.seek(0)
    return infile


def test_the_arrow_schema_of_the_batches_is_pysparks_own_conversion_of_the_schema() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_the_runner_sees_a_source_with_read_limits_and_trigger_available_now() -> None:
    out = io.BytesIO()
    runner.check_support_func(reader()[0], out)
    flags = read_int(io.BytesIO(out.getvalue()))
    assert flags & runner.SUPPORTS_ADMISSION_CONTROL and flags & runner.SUPPORTS_TRIGGER_AVAILABLE_NOW


def test_the_default_read_limit_is_max_records_per_trigger_as_the_runner_serializes_it() -> None:
    out = io.BytesIO()
    runner.get_default_read_limit_func(reader()[0], out)
    limit = json.loads(out.getvalue()[4:])
    assert limit == {"_type": "ReadMaxRows", "max_rows": 25}


def test_latest_offset_gets_the_limit_and_partitions_send_its_batches_prefetched() -> None:
    source, engine = reader()
    start = json.dumps(initial_offset())
    out = io.BytesIO()
    runner.latest_offset_admission_control_func(
        source, sent(start, json.dumps({"_type": "ReadMaxRows", "max_rows": 2})), out
    )
    assert json.loads(out.getvalue()[4:]) == END
    assert engine.asked == [(initial_offset(), 2, None)]

    out = io.BytesIO()
    runner.partitions_func(source, DefaultSource(OPTIONS), SCHEMA, 10_000, sent(start, json.dumps(END)), out)
    answer = io.BytesIO(out.getvalue())
    assert read_int(answer) == 1  # one input partition
    answer.read(read_int(answer))  # ... pickled
    assert read_int(answer) == runner.NON_EMPTY_PYARROW_RECORD_BATCHES
    assert read_int(answer) == SpecialLengths.START_ARROW_STREAM
    table = pa.ipc.open_stream(answer).read_all()
    assert table.schema.equals(ARROW_SCHEMA) and table.column("sequenceNumber").to_pylist() == ["1", "2", "3"]


def test_a_range_this_process_did_not_plan_is_left_to_the_executor_to_read_again() -> None:
    out = io.BytesIO()
    start = json.dumps(initial_offset())
    runner.partitions_func(reader()[0], DefaultSource(OPTIONS), SCHEMA, 10_000, sent(start, json.dumps(END)), out)
    answer = io.BytesIO(out.getvalue())
    assert read_int(answer) == 1
    answer.read(read_int(answer))
    assert read_int(answer) == runner.PREFETCHED_RECORDS_NOT_FOUND


def test_trigger_available_now_is_prepared_on_the_planner_and_reaches_the_engine() -> None:
    source, engine = reader()
    runner.prepare_for_trigger_available_now_func(source, io.BytesIO())
    at_ms = source.simple_reader.available_now_at_ms
    assert at_ms is not None
    source.latestOffset(initial_offset(), source.getDefaultReadLimit())
    assert engine.available_now_at_ms == at_ms


def test_a_reader_is_pickled_without_its_engine_and_stop_closes_the_engine() -> None:
    source, engine = reader()
    copy = pickle.loads(pickle.dumps(source))
    assert copy._engine is None and copy.options == source.options
    source.stop()
    assert engine.closed
