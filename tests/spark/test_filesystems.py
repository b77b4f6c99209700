"""The sink file-system pre-flight on a real SparkSession: pyspark's own jars have no hadoop-aws."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from efo.config import Settings, load_settings
from efo.errors import EXIT_CONFIG, ConfigError
from sparkbridge.filesystems import require_filesystems, require_writable, sink_paths

pytestmark = pytest.mark.spark

S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def settings(sink: str, **extra: str) -> Settings:
    return load_settings(stream="orders", app="lake", sink=sink, **extra)


def test_an_s3a_sink_without_hadoop_aws_is_refused_with_one_line_naming_the_jars(spark: SparkSession) -> None:
    hadoop = spark._jvm.org.apache.hadoop.util.VersionInfo.getVersion()
    with pytest.raises(ConfigError) as refused:
        require_filesystems(spark, sink_paths(settings("parquet:s3a://lake/orders")))
    message = str(refused.value)
    assert refused.value.exit_code == EXIT_CONFIG
    assert "\n" not in message
    assert message.startswith("sink (EFO_SINK) = 'parquet:s3a://lake/orders': ")
    assert f"Class {S3A_CLASS} not found" in message
    assert f"hadoop-aws-{hadoop}.jar" in message and "AWS SDK bundle" in message
    assert f"spark.jars.packages=org.apache.hadoop:hadoop-aws:{hadoop}" in message


def test_the_dead_letter_sink_is_checked_too_and_a_caller_sink_replaces_only_the_main_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    both = settings(
        f"parquet:{tmp_path}/out",
        on_corrupt_aggregate="dead_letter",
        dead_letter_sink="parquet:s3a://lake/dead",
    )
    with pytest.raises(ConfigError, match=r"^dead_letter_sink \(EFO_DEAD_LETTER_SINK\) = 'parquet:s3a://lake/dead'"):
        require_filesystems(spark, sink_paths(both))
    own_sink = settings("parquet:s3a://lake/orders")
    assert sink_paths(own_sink, main_sink=False) == []
    require_filesystems(spark, sink_paths(own_sink, main_sink=False))


def test_local_paths_handlers_and_console_sinks_pass(spark: SparkSession, tmp_path: Path) -> None:
    for sink in (f"parquet:{tmp_path}/out", f"parquet:file://{tmp_path}/out", "console", "handler:json:dumps"):
        require_filesystems(spark, sink_paths(settings(sink)))


@pytest.fixture
def s3a_mapped_to_a_loadable_class(spark: SparkSession) -> Iterator[None]:
    conf = spark._jsc.hadoopConfiguration()
    conf.set("fs.s3a.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
    try:
        yield
    finally:
        conf.unset("fs.s3a.impl")


@pytest.mark.usefixtures("s3a_mapped_to_a_loadable_class")
def test_an_s3a_sink_passes_when_hadoop_can_load_its_file_system_class(spark: SparkSession) -> None:
    require_filesystems(spark, sink_paths(settings("parquet:s3a://lake/orders")))


def test_an_s3_sink_is_refused_before_any_write_saying_to_use_s3a(spark: SparkSession) -> None:
    with pytest.raises(ConfigError) as refused:
        require_filesystems(spark, sink_paths(settings("parquet:s3://lake/orders")))
    message = str(refused.value)
    assert message.startswith("sink (EFO_SINK) = 'parquet:s3://lake/orders': ")
    assert 'UnsupportedFileSystemException: No FileSystem for scheme "s3"' in message and "s3a://" in message


def test_a_sink_path_under_a_file_is_refused_naming_the_java_cause_and_leaves_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "afile").write_text("a file")
    paths = sink_paths(settings(f"parquet:{tmp_path}/afile/orders"))
    require_filesystems(spark, paths)  # the scheme is fine
    with pytest.raises(ConfigError) as refused:
        require_writable(spark, paths)
    message = str(refused.value)
    assert refused.value.exit_code == EXIT_CONFIG and "\n" not in message
    assert message.startswith(f"sink (EFO_SINK) = 'parquet:{tmp_path}/afile/orders': cannot write under ")
    assert "org.apache.hadoop.fs.ParentNotDirectoryException" in message and "a part of the path is a file" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_writable_path_passes_and_is_left_as_it_was(spark: SparkSession, tmp_path: Path) -> None:
    new = tmp_path / "lake" / "orders"
    require_writable(spark, sink_paths(settings(f"parquet:{new}")))
    assert list(tmp_path.iterdir()) == []  # the directories the probe made are gone again
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "efo_batch_id=1").mkdir()
    require_writable(spark, sink_paths(settings(f"parquet:file://{existing}")))
    assert [p.name for p in existing.iterdir()] == ["efo_batch_id=1"]


# ---- efo doctor's sink checks (efo/doctor/sink.py), on the session of the tests -----------------


def test_the_doctors_sink_checks_hold_and_fail_each_way_and_leave_nothing(spark: SparkSession, tmp_path: Path) -> None:
    from efo.doctor.findings import Report
    from efo.doctor.sink import check_sinks

    def checked(sinks: Settings, *, write: bool = True) -> dict[tuple[str, str], tuple[str, str]]:
        report = Report()
        check_sinks(report, sinks, write=write, spark=spark)
        return {(f.check, f.resource): (f.status, f.detail) for f in report.findings}

    (tmp_path / "afile").write_text("a file")
    good, bad = f"parquet:{tmp_path}/lake/orders", f"parquet:{tmp_path}/afile/dead"
    found = checked(settings(good, on_corrupt_aggregate="dead_letter", dead_letter_sink=bad))
    main, dead = f"sink = '{good}'", f"dead_letter_sink = '{bad}'"
    assert found[("sink.filesystem", main)][0] == found[("sink.write", main)][0] == "ok"
    assert found[("sink.filesystem", dead)][0] == "ok"
    status, detail = found[("sink.write", dead)]
    assert status == "fail" and "org.apache.hadoop.fs.ParentNotDirectoryException" in detail
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the probe's directories are gone

    status, detail = checked(settings("parquet:s3://lake/orders"))[
        ("sink.filesystem", "sink = 'parquet:s3://lake/orders'")
    ]
    assert status == "fail" and 'No FileSystem for scheme "s3"' in detail and "s3a://" in detail

    assert checked(settings(good), write=False)[("sink.write", main)] == ("skip", "not checked: --no-write")
    assert not spark.sparkContext._jsc.sc().isStopped()  # a session it was given, it leaves running
