"""Pre-flight for the sinks' file systems: a path Spark cannot open or write is refused before any
record is read, and before the start registers a consumer or creates a table.

Spark resolves a path's file system only when it first writes there, which for an ``s3a://`` sink
without hadoop-aws is after the first batch was read (``ClassNotFoundException:
org.apache.hadoop.fs.s3a.S3AFileSystem``), and for ``s3://`` (no file system in Hadoop 3) or a
path under a file just the same. Asking Hadoop for the scheme's class at start-up, the way the
write will, and writing and deleting a file under the path (:func:`require_writable`) turn those
into one line that says what to do.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from efo.config import Settings, SinkSpec
from efo.errors import ConfigError, EfoError
from sparkbridge.failures import cause_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Schemes whose file system lives outside Spark's own jars, and the Hadoop artifact that brings it.
EXTERNAL_FILESYSTEMS = {"s3a": "hadoop-aws"}


def sink_paths(settings: Settings, *, main_sink: bool = True) -> list[tuple[str, str]]:
    """``(setting, path)`` of every sink of the settings that writes a path (a kind whose target is
    a path: parquet), without ``sink`` when the caller brings its own sink object."""
    sinks = {"dead_letter_sink (EFO_DEAD_LETTER_SINK)": settings.dead_letter_sink}
    if main_sink:
        sinks["sink (EFO_SINK)"] = settings.sink
    specs = {setting: SinkSpec.parse(text) for setting, text in sinks.items() if text}
    return [(f"{setting} = '{spec}'", spec.target) for setting, spec in specs.items() if spec.declared.writes_path]


def require_filesystems(spark: SparkSession, paths: list[tuple[str, str]]) -> None:
    """Raise :class:`ConfigError` (exit 2) for the first path whose file system class this Spark
    cannot load, naming what to add. A Spark Connect session is not checked: the cluster writes."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    hadoop_conf = spark._jsc.hadoopConfiguration()
    for setting, path in paths:
        scheme = urlsplit(path).scheme.lower() or "file"
        artifact = EXTERNAL_FILESYSTEMS.get(scheme)
        try:
            jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, hadoop_conf)
        except Exception as exc:  # py4j's wrapper of the JVM's ClassNotFoundException
            if artifact is None:  # a scheme Hadoop has no file system for (s3://, a typo)
                cause = cause_of(exc)
                raise ConfigError(f"{setting}: {cause}; {cause.advice}") from None
            version = jvm.org.apache.hadoop.util.VersionInfo.getVersion()
            raise ConfigError(
                f"{setting}: {_java_cause(exc)}; add {artifact}-{version}.jar and the AWS SDK bundle it depends "
                f"on to pyspark's jars (the efo image has them), or set spark.jars.packages="
                f"org.apache.hadoop:{artifact}:{version} in spark.conf (EFO_SPARK__CONF)"
            ) from None


#: The name of the directory :func:`require_writable` writes its probe file in, under the sink's path.
PROBE_PREFIX = "_efo_write_check-"


def require_writable(spark: SparkSession, paths: list[tuple[str, str]]) -> None:
    """Write and delete a file under each path, as the sink's first batch would write there: a
    directory ``_efo_write_check-<random>`` with an empty file in it. Directories this made (the
    sink's path itself, when it did not exist yet) are removed again: it leaves nothing behind.
    A cause no retry helps (a parent that is a file, access denied) is a :class:`ConfigError`
    (exit 2), any other an :class:`EfoError` (exit 1). A Spark Connect session is not checked."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    hadoop_conf = spark._jsc.hadoopConfiguration()
    for setting, path in paths:
        made: list[Any] = []  # directories the probe creates, the deepest first
        try:
            target = jvm.org.apache.hadoop.fs.Path(path)
            fs = target.getFileSystem(hadoop_conf)
            ancestor = target
            while ancestor is not None and not fs.exists(ancestor):
                made.append(ancestor)
                ancestor = ancestor.getParent()
            probe = jvm.org.apache.hadoop.fs.Path(target, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
            fs.create(jvm.org.apache.hadoop.fs.Path(probe, "probe"), True).close()
            fs.delete(probe, True)
            for directory in made:
                fs.delete(directory, False)  # only if empty: what another writer put there meanwhile stays
        except Exception as exc:
            cause = cause_of(exc)
            error = ConfigError if cause.permanent else EfoError
            raise error(f"{setting}: cannot write under {path}: {cause}; {cause.advice}") from None


def _java_cause(exc: Exception) -> str:
    """``Class org.apache.hadoop.fs.s3a.S3AFileSystem not found`` out of py4j's multi-line message."""
    lines = str(exc).splitlines()
    return lines[1].rsplit(": ", 1)[-1].strip() if len(lines) > 1 else type(exc).__name__
