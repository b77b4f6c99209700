"""``efo doctor``'s checks of the sinks: the sink's module for ``handler:`` and ``arrow:``; for
``parquet:``, a Spark session as ``efo run`` starts it, the file system of the path's scheme (its
class present), and a test write and delete under a temporary prefix. Spark is loaded lazily:
efo itself never imports pyspark."""

from __future__ import annotations

from typing import Any

from efo.config import Settings, SinkSpec
from efo.doctor.findings import Report
from efo.errors import EfoError
from efo.sink_kinds import Target
from efo.spark_side import load as load_spark_side


def check_sinks(report: Report, settings: Settings, *, write: bool, spark: Any = None) -> None:
    """Each sink of the settings (the sink, and the dead-letter sink if set). A ``parquet:`` sink is
    checked on ``spark``, or on a session started as ``efo run`` starts it (and stopped again)."""
    sinks = {"sink": settings.sink, "dead_letter_sink": settings.dead_letter_sink}
    parquet: list[tuple[str, str]] = []
    for setting, text in sinks.items():
        if not text:
            continue
        spec = SinkSpec.parse(text)
        label = f"{setting} = '{spec}'"
        if spec.declared.writes_path:
            parquet.append((label, spec.target))
        elif spec.declared.target is Target.FUNCTION:
            try:
                load_spark_side().check_sink(spec)
            except EfoError as error:
                report.add("sink.module", label, "fail", str(error))
            else:
                report.add("sink.module", label, "ok", f"{spec.target} imports and is a function")
        else:
            report.add("sink", label, "ok", "prints each batch (for a quick look, not a deployment)")
    if not parquet:
        return
    if settings.spark_remote:
        for label, _ in parquet:
            report.add("sink.write", label, "skip", "not checked: the Spark Connect cluster writes, not this process")
        return
    _check_paths(report, settings, parquet, write=write, spark=spark)


def _check_paths(
    report: Report, settings: Settings, parquet: list[tuple[str, str]], *, write: bool, spark: Any
) -> None:
    own = spark is None
    try:
        side = load_spark_side()
        # Without the spark extra, start_session raises a ConfigError saying what to install.
        spark = side.start_session(settings, "efo-doctor") if own else spark
    except Exception as exc:  # a JVM that does not start: no path can be checked
        for label, _ in parquet:
            report.add("sink.filesystem", label, "fail", f"Spark did not start ({type(exc).__name__}: {exc})")
        return
    try:
        for label, path in parquet:
            try:
                side.require_filesystems(spark, [(label, path)])
            except EfoError as error:
                report.add("sink.filesystem", label, "fail", str(error).removeprefix(f"{label}: "))
                continue
            report.add("sink.filesystem", label, "ok", "Hadoop has a file system for its scheme")
            if not write:
                report.add("sink.write", label, "skip", "not checked: --no-write")
                continue
            try:
                side.require_writable(spark, [(label, path)])
            except EfoError as error:
                report.add("sink.write", label, "fail", str(error).removeprefix(f"{label}: "))
            else:
                report.add("sink.write", label, "ok", f"wrote and deleted a file under {path}/_efo_write_check-*")
    finally:
        if own:
            spark.stop()
