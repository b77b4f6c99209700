"""Pre-flight for the sinks' file systems: a path Spark cannot open is refused before any record is read.

Spark resolves a path's file system only when it first writes there, which for an ``s3a://`` sink
without hadoop-aws is after the first batch was read (``ClassNotFoundException:
org.apache.hadoop.fs.s3a.S3AFileSystem``). Asking Hadoop for the class at start-up, the way the
write will, turns that into one line that says what to add.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pyspark.sql import SparkSession

from efo.config import Settings, SinkSpec
from efo.errors import ConfigError

#: Schemes whose file system lives outside Spark's own jars, and the Hadoop artifact that brings it.
EXTERNAL_FILESYSTEMS = {"s3a": "hadoop-aws"}


def sink_paths(settings: Settings, *, main_sink: bool = True) -> list[tuple[str, str]]:
    """``(setting, path)`` of every Parquet sink of the settings (without ``sink`` when the caller
    brings its own sink object); the other sinks write no path."""
    sinks = {"dead_letter_sink (EFO_DEAD_LETTER_SINK)": settings.dead_letter_sink}
    if main_sink:
        sinks["sink (EFO_SINK)"] = settings.sink
    specs = {setting: SinkSpec.parse(text) for setting, text in sinks.items() if text}
    return [(f"{setting} = '{spec}'", spec.target) for setting, spec in specs.items() if spec.kind == "parquet"]


def require_filesystems(spark: SparkSession, paths: list[tuple[str, str]]) -> None:
    """Raise :class:`ConfigError` (exit 2) for the first path whose file system class this Spark
    cannot load, naming what to add. A Spark Connect session is not checked: the cluster writes."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    hadoop_conf = spark._jsc.hadoopConfiguration()
    for setting, path in paths:
        scheme = urlsplit(path).scheme.lower()
        artifact = EXTERNAL_FILESYSTEMS.get(scheme)
        if artifact is None:
            continue
        try:
            jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, hadoop_conf)
        except Exception as exc:  # py4j's wrapper of the JVM's ClassNotFoundException
            version = jvm.org.apache.hadoop.util.VersionInfo.getVersion()
            raise ConfigError(
                f"{setting}: {_java_cause(exc)}; add {artifact}-{version}.jar and the AWS SDK bundle it depends "
                f"on to pyspark's jars (the efo image has them), or set spark.jars.packages="
                f"org.apache.hadoop:{artifact}:{version} in spark.conf (EFO_SPARK__CONF)"
            ) from None


def _java_cause(exc: Exception) -> str:
    """``Class org.apache.hadoop.fs.s3a.S3AFileSystem not found`` out of py4j's multi-line message."""
    lines = str(exc).splitlines()
    return lines[1].rsplit(": ", 1)[-1].strip() if len(lines) > 1 else type(exc).__name__
