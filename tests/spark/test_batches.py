"""The batch path on a real SparkSession: Arrow -> DataFrame -> decoding -> sink, retries, dedupe."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from efo.errors import SinkFailed
from efo.pipeline.handoff import Handoff
from efo.pipeline.records import RecordChunk, Row
from sparkbridge.batches import INVALID_JSON, BatchRunner, ValueDecoder
from sparkbridge.session import LOCAL_RELATION_THRESHOLD
from sparkbridge.sinks import BatchInfo, ConsoleSink, HandlerSink, ParquetSink

pytestmark = pytest.mark.spark


def chunk(shard: str, first: int, count: int, *, serial: int = 1, epoch: int = 0, payload: Any = None) -> RecordChunk:
    rows = (
        Row(
            str(10**40 + i),
            payload(i) if payload else f"record-{shard}-{i}".encode(),
            f"pk-{i % 3}",
            1_700_000_000_000 + i,
        )
        for i in range(first, first + count)
    )
    return RecordChunk.of_rows("orders", shard, serial, rows, epoch=epoch)


class Recorder:
    def __init__(self, fail_times: int = 0) -> None:
        self.calls: list[tuple[BatchInfo, list[dict[str, Any]]]] = []
        self.fail_times = fail_times

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        self.calls.append((batch, [r.asDict() for r in df.collect()]))
        if len(self.calls) <= self.fail_times:
            raise OSError(f"sink down (attempt {batch.attempt})")


def runner(spark: SparkSession, sink: Any, **kwargs: Any) -> BatchRunner:
    sleeps: list[float] = []
    r = BatchRunner(
        spark, sink, max_attempts=kwargs.pop("max_attempts", 3), retry_backoff_s=0.5, sleep=sleeps.append, **kwargs
    )
    r.sleeps = sleeps  # type: ignore[attr-defined]
    return r


def test_batch_rows_keep_schema_values_and_per_shard_sequence_order(spark: SparkSession) -> None:
    handoff = Handoff()
    for c in (chunk("s-1", 0, 5, serial=1), chunk("s-2", 0, 3, serial=1), chunk("s-1", 5, 5, serial=2)):
        handoff.put(c)
    chunks = handoff.take_batch(max_records=100, max_bytes=10**6, max_wait_s=0)
    sink = Recorder()
    result = runner(spark, sink).run("b-1", chunks)
    ((info, rows),) = sink.calls
    assert [r["sequence_number"] for r in rows if r["shard_id"] == "s-1"] == [str(10**40 + i) for i in range(10)]
    assert info.shards["orders", "s-1"].records == 10 and info.shards["orders", "s-2"].records == 3
    assert info.shards["orders", "s-1"].first_sequence_number == str(10**40) and info.batch_id == "b-1"
    first = rows[0]
    assert first["approximate_arrival_timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC).replace(
        tzinfo=None
    )
    assert first["data"] == bytearray(b"record-s-1-0") and first["sub_sequence_number"] is None
    assert result.duplicates == 0 and len(result.chunks) == 3


def test_handoff_batch_closes_at_max_records_without_splitting_chunks(spark: SparkSession) -> None:
    handoff = Handoff()
    for serial in range(1, 5):
        handoff.put(chunk("s-1", serial * 10, 10, serial=serial))
    first = handoff.take_batch(max_records=25, max_bytes=10**6, max_wait_s=0)
    second = handoff.take_batch(max_records=25, max_bytes=10**6, max_wait_s=0)
    assert [c.serial for c in first] == [1, 2] and [c.serial for c in second] == [3, 4]


def test_parquet_sink_rerun_of_the_same_batch_replaces_its_own_partition(spark: SparkSession, tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path / "out"))
    r = runner(spark, sink)
    r.run("run-a-00000001", [chunk("s-1", 0, 20)])
    r.watermark = type(r.watermark)()  # the same rows again, as a retry in the same process would send
    r.run("run-a-00000001", [chunk("s-1", 0, 20)])
    r.run("run-a-00000002", [chunk("s-1", 20, 5, serial=2)])
    table = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 25
    assert sorted(set(table.column("efo_batch_id").to_pylist())) == ["run-a-00000001", "run-a-00000002"]


def test_parquet_sink_writes_data_and_sequence_numbers_without_a_dictionary_nor_payload_statistics(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Payloads that repeat: a dictionary would be kept for them if it were tried (unique ones fall back to plain).
    rows = [chunk("s-1", 0, 50, payload=lambda i: b"the same payload")]
    runner(spark, ParquetSink(str(tmp_path / "out"))).run("run-d-00000001", rows)
    files = sorted((tmp_path / "out" / "efo_batch_id=run-d-00000001").glob("*.parquet"))
    assert files
    assert (tmp_path / "out" / "efo_batch_id=run-d-00000001" / "_SUCCESS").exists()  # written last: complete
    for file in files:
        group = pq.ParquetFile(file).metadata.row_group(0)
        columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
        for unique in ("sequence_number", "data"):
            assert not any("DICTIONARY" in e for e in columns[unique].encodings), (unique, columns[unique].encodings)
        assert not columns["data"].is_stats_set
        assert columns["sequence_number"].is_stats_set
        assert any("DICTIONARY" in e for e in columns["partition_key"].encodings)


def test_parquet_sink_puts_a_batch_id_of_other_characters_in_an_escaped_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = ParquetSink(str(tmp_path / "out"))
    r = runner(spark, sink)
    r.run("run a:1", [chunk("s-1", 0, 4)])
    r.watermark = type(r.watermark)()
    r.run("run a:1", [chunk("s-1", 0, 4)])
    r.run("run-b-00000001", [chunk("s-1", 4, 3, serial=2)])
    dirs = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir())
    assert dirs == ["efo_batch_id=run a%3A1", "efo_batch_id=run-b-00000001"]
    table = spark.read.parquet(str(tmp_path / "out")).toArrow()
    assert sorted(set(table.column("efo_batch_id").to_pylist())) == ["run a:1", "run-b-00000001"]
    assert table.num_rows == 7


class PlanRecorder(ParquetSink):
    """The Parquet sink, noting the analyzed plan of each DataFrame it is handed."""

    plans: list[str]

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        self.plans = [*getattr(self, "plans", []), df._jdf.queryExecution().analyzed().toString()]
        super().write(df, batch)


def test_a_parquet_batch_is_made_from_arrow_in_the_tasks_one_arrow_batch_per_core(
    spark: SparkSession, tmp_path: Path
) -> None:
    # A local relation copies every row on the driver and ships it inside each task (twice the JVM's CPU).
    threshold = spark.conf.get(LOCAL_RELATION_THRESHOLD)
    sink = PlanRecorder(str(tmp_path / "out"))
    runner(spark, sink).run("run-t-00000001", [chunk("s-1", 0, 25_000)])
    assert "LocalRelation" not in sink.plans[0], sink.plans[0]
    # One Arrow batch (one task, one file) per core, not one per 10,000 rows.
    files = list((tmp_path / "out" / "efo_batch_id=run-t-00000001").glob("*.parquet"))
    assert len(files) == spark.sparkContext.defaultParallelism == 1
    assert pq.read_table(files[0]).num_rows == 25_000
    assert spark.conf.get(LOCAL_RELATION_THRESHOLD) == threshold  # the session's settings are as they were


def test_a_handler_sinks_batch_stays_a_local_relation_whose_size_spark_knows(spark: SparkSession) -> None:
    plans: list[str] = []
    sink = Recorder()
    sink.write = lambda df, batch: plans.append(df._jdf.queryExecution().analyzed().toString())  # type: ignore[method-assign]
    runner(spark, sink).run("b-h", [chunk("s-1", 0, 10)])
    assert "LocalRelation" in plans[0]  # joins in the handler may broadcast the batch


def test_handler_sink_is_called_with_dataframe_and_batch(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "my_handlers.py"
    module.write_text(
        "calls = []\ndef handle(df, batch):\n    calls.append((batch.batch_id, batch.records, df.count()))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sink = HandlerSink("my_handlers:handle")
    runner(spark, sink).run("b-7", [chunk("s-1", 0, 4)])
    import my_handlers  # type: ignore[import-not-found]

    assert my_handlers.calls == [("b-7", 4, 4)]


def test_console_sink_prints_the_batch(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    runner(spark, ConsoleSink()).run("b-c", [chunk("s-1", 0, 2)])
    out = capsys.readouterr().out
    assert "batch b-c: 2 records" in out and "s-1" in out


def test_failing_sink_is_retried_with_the_same_batch_id_and_rows(spark: SparkSession) -> None:
    sink = Recorder(fail_times=2)
    r = runner(spark, sink)
    result = r.run("b-r", [chunk("s-1", 0, 6)])
    assert [info.attempt for info, _ in sink.calls] == [1, 2, 3]
    assert {info.batch_id for info, _ in sink.calls} == {"b-r"}
    assert sink.calls[0][1] == sink.calls[2][1]
    assert r.sleeps == [0.5, 1.0]  # type: ignore[attr-defined]
    assert result.info.attempt == 3


def test_sink_failing_every_attempt_raises_sink_failed_naming_the_batch(spark: SparkSession) -> None:
    sink = Recorder(fail_times=99)
    with pytest.raises(SinkFailed, match="b-x after 3 attempts"):
        runner(spark, sink).run("b-x", [chunk("s-1", 0, 3)])
    assert len(sink.calls) == 3


def test_no_sink_attempt_starts_once_the_shutdown_deadline_leaves_no_time_for_it(spark: SparkSession) -> None:
    now = [100.0]
    sink = Recorder(fail_times=99)
    r = runner(spark, sink, max_attempts=10, give_up_at=lambda: 101.2, clock=lambda: now[0])
    r._sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)  # type: ignore[method-assign]
    with pytest.raises(SinkFailed, match=r"b-d .*shutdown deadline leaves no time for another attempt"):
        r.run("b-d", [chunk("s-1", 0, 3)])
    assert len(sink.calls) == 2  # at 100.0, then 100.5; the next delay (1.0 s) would pass 101.2
    assert now[0] <= 101.2


def test_records_reaching_the_driver_twice_are_dropped_and_counted(spark: SparkSession) -> None:
    sink = Recorder()
    r = runner(spark, sink)
    r.run("b-1", [chunk("s-1", 0, 10)])
    result = r.run("b-2", [chunk("s-1", 5, 10, serial=2)])  # 5..9 overlap
    assert result.duplicates == 5
    assert [row["sequence_number"] for row in sink.calls[1][1]] == [str(10**40 + i) for i in range(10, 15)]
    assert [c.serial for c in result.chunks] == [2]  # the chunk is still acknowledged whole


def test_a_new_epoch_of_the_shard_resets_the_watermark_backwards(spark: SparkSession) -> None:
    sink = Recorder()
    r = runner(spark, sink)
    r.run("b-1", [chunk("s-1", 0, 10, epoch=1)])
    result = r.run("b-2", [chunk("s-1", 0, 4, epoch=2)])  # restarted at an explicit earlier position
    assert result.duplicates == 0 and len(sink.calls[1][1]) == 4


def test_json_decoding_adds_columns_keeps_bad_rows_with_error_and_counts_them(spark: SparkSession) -> None:
    def payload(i: int) -> bytes:
        return b"{not json" if i % 4 == 0 else json.dumps({"id": i, "name": f"n{i}"}).encode()

    sink = Recorder()
    r = runner(spark, sink, decoder=ValueDecoder("json", "id BIGINT, name STRING"))
    result = r.run("b-j", [chunk("s-1", 0, 8, payload=payload)])
    rows = sink.calls[0][1]
    assert len(rows) == 8
    good = [row for row in rows if row["error"] is None]
    bad = [row for row in rows if row["error"] == INVALID_JSON]
    assert len(bad) == 2 and all(row["id"] is None and row["name"] is None for row in bad)
    assert {row["id"] for row in good} == {1, 2, 3, 5, 6, 7}
    assert bad[0]["data"] == bytearray(b"{not json")  # data is never changed
    assert result.invalid_json == 2


def test_utf8_decoding_adds_a_value_column(spark: SparkSession) -> None:
    sink = Recorder()
    runner(spark, sink, decoder=ValueDecoder("utf8", None)).run("b-u", [chunk("s-1", 0, 2)])
    assert [row["value"] for row in sink.calls[0][1]] == ["record-s-1-0", "record-s-1-1"]


def test_dead_letters_go_to_the_dead_letter_sink_before_the_batch_and_with_their_reason(spark: SparkSession) -> None:
    from efo.kinesis.kpl import DeadLetter

    main, dead = Recorder(), Recorder()
    r = BatchRunner(spark, main, max_attempts=2, retry_backoff_s=0, dead_letter_sink=dead, sleep=lambda s: None)
    good = chunk("s-1", 0, 3)
    only_dead = chunk("s-1", 3, 0, serial=2)
    only_dead.dead_letters.append(
        DeadLetter(str(10**40 + 3), "pk-x", 1_700_000_000_003, b"\xf3\x89\x9a\xc2junk", "md5 mismatch")
    )
    result = r.run("b-d", [good, only_dead])
    ((dead_info, dead_rows),) = dead.calls
    assert dead_info.batch_id == "b-d-dead-letters"
    assert dead_rows[0]["error"] == "corrupt_aggregate: md5 mismatch" and dead_rows[0]["data"] == bytearray(
        b"\xf3\x89\x9a\xc2junk"
    )
    assert [row["sequence_number"] for row in main.calls[0][1]] == [str(10**40 + i) for i in range(3)]
    assert [c.serial for c in result.chunks] == [1, 2]  # the dead-letter-only chunk is acknowledged too


def test_a_failing_dead_letter_sink_fails_the_batch_before_the_main_sink_runs(spark: SparkSession) -> None:
    from efo.kinesis.kpl import DeadLetter

    main, dead = Recorder(), Recorder(fail_times=99)
    r = BatchRunner(spark, main, max_attempts=2, retry_backoff_s=0, dead_letter_sink=dead, sleep=lambda s: None)
    c = chunk("s-1", 0, 2)
    c.dead_letters.append(DeadLetter(str(10**40 + 9), "pk", 1, b"x", "truncated varint"))
    with pytest.raises(SinkFailed, match="dead_letter_sink failed on batch b-f-dead-letters after 2 attempts"):
        r.run("b-f", [c])
    assert main.calls == []


def test_parquet_sink_partitions_by_arrival_date_before_the_batch_and_replaces_on_retry(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = ParquetSink(str(tmp_path / "out"), ("arrival_date",))
    r = runner(spark, sink)
    r.run("run-p-00000001", [chunk("s-1", 0, 6)])
    r.watermark = type(r.watermark)()
    r.run("run-p-00000001", [chunk("s-1", 0, 6)])
    dirs = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").glob("*/*") if p.is_dir())
    assert dirs == ["arrival_date=2023-11-14/efo_batch_id=run-p-00000001"]
    assert ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").count_rows() == 6
    # The same writer settings as without partition columns.
    (file,) = (tmp_path / "out").glob("*/*/*.parquet")
    group = pq.ParquetFile(file).metadata.row_group(0)
    data = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "data")
    assert not data.is_stats_set


def test_parquet_sink_refuses_an_unknown_partition_column_naming_the_setting() -> None:
    from efo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"EFO_PARQUET_PARTITION_BY.*allowed: arrival_date"):
        ParquetSink("/tmp/x", ("data",))
