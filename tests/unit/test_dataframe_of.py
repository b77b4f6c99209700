"""sparkbridge.session.dataframe_of against a stand-in session: which settings are in force while
the DataFrame is made, and that the session's own are back afterwards, whatever happens."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from sparkbridge import session as sessions
from sparkbridge.session import LOCAL_RELATION_THRESHOLD, MAX_RECORDS_PER_BATCH, dataframe_of
from sparkbridge.sinks import HandlerSink, ParquetSink, rows_in_tasks

DEFAULTS = {LOCAL_RELATION_THRESHOLD: "48MB", MAX_RECORDS_PER_BATCH: "10000"}


class Conf:
    def __init__(self) -> None:
        self.values = dict(DEFAULTS)
        self.fail_set: str | None = None

    def get(self, key: str) -> str:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        if key == self.fail_set and value == DEFAULTS[key]:
            raise RuntimeError(f"cannot put {key} back")
        self.values[key] = value


class Session:
    def __init__(self, cores: int = 4, fail: bool = False) -> None:
        self.conf = Conf()
        self.sparkContext = SimpleNamespace(defaultParallelism=cores)
        self.seen: list[dict[str, str]] = []
        self.fail = fail

    def createDataFrame(self, table: pa.Table) -> Any:
        self.seen.append(dict(self.conf.values))
        if self.fail:
            raise RuntimeError("the JVM went away")
        return table


def table(rows: int, size: int = 10) -> pa.Table:
    return pa.table({"data": pa.array([b"x" * size] * rows, pa.binary())})


def test_rows_in_tasks_makes_one_arrow_batch_per_core_and_puts_the_settings_back() -> None:
    spark = Session(cores=4)
    dataframe_of(spark, table(10), rows_in_tasks=True)  # type: ignore[arg-type]
    assert spark.seen == [{LOCAL_RELATION_THRESHOLD: "0", MAX_RECORDS_PER_BATCH: "3"}]
    assert spark.conf.values == DEFAULTS


def test_an_arrow_batch_stays_under_its_byte_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "ARROW_BATCH_MAX_BYTES", 2_000)
    spark = Session(cores=2)
    t = table(100, size=100)
    dataframe_of(spark, t, rows_in_tasks=True)  # type: ignore[arg-type]
    per_batch = int(spark.seen[0][MAX_RECORDS_PER_BATCH])
    assert per_batch < 50 and per_batch * t.nbytes / t.num_rows <= 2_000


def test_the_settings_are_put_back_when_making_the_dataframe_fails() -> None:
    spark = Session(fail=True)
    with pytest.raises(RuntimeError, match="the JVM went away"):
        dataframe_of(spark, table(10), rows_in_tasks=True)  # type: ignore[arg-type]
    assert spark.conf.values == DEFAULTS


def test_every_setting_is_put_back_even_when_one_cannot_be() -> None:
    spark = Session()
    spark.conf.fail_set = LOCAL_RELATION_THRESHOLD  # the first one set, the last one put back
    with pytest.raises(RuntimeError, match="cannot put"):
        dataframe_of(spark, table(10), rows_in_tasks=True)  # type: ignore[arg-type]
    assert spark.conf.values[MAX_RECORDS_PER_BATCH] == DEFAULTS[MAX_RECORDS_PER_BATCH]


def test_other_sinks_and_empty_tables_leave_the_settings_alone() -> None:
    spark = Session()
    dataframe_of(spark, table(10), rows_in_tasks=False)  # type: ignore[arg-type]
    dataframe_of(spark, table(0), rows_in_tasks=True)  # type: ignore[arg-type]
    assert spark.seen == [DEFAULTS, DEFAULTS]


def test_a_spark_connect_session_is_left_alone() -> None:
    connect = type("SparkSession", (Session,), {"__module__": "pyspark.sql.connect.session"})()
    dataframe_of(connect, table(10), rows_in_tasks=True)
    assert connect.seen == [DEFAULTS]


def test_which_sinks_have_their_rows_made_in_the_tasks(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "writers.py"
    module.write_text("def joins(df, batch): pass\ndef writes(df, batch): pass\nwrites.rows_in_tasks = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert rows_in_tasks(ParquetSink(str(tmp_path / "out")))
    assert not rows_in_tasks(HandlerSink("writers:joins"))  # a local relation: joins may broadcast it
    assert rows_in_tasks(HandlerSink("writers:writes"))
