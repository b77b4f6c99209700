"""What a sink's exception means: its cause (the Java exception inside py4j's wrapper, not
``Py4JJavaError: An error occurred while calling o89.parquet``), whether a retry can help, and what
to do about it, for the one ``efo:`` line an operator reads.

A write that fails because of where it writes (a parent that is a file, a scheme Hadoop has no file
system for, a class missing from the classpath, access denied, a bucket that does not exist) or
because of what it writes (a query Spark cannot analyse) fails the same way on every attempt: it is
*permanent*, and the batch runner stops at once instead of retrying it for half a minute.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

#: Java exceptions that a retry of the same write meets again, and what to do about each.
PERMANENT_JAVA: dict[str, str] = {
    "org.apache.hadoop.fs.ParentNotDirectoryException": (
        "a part of the path is a file, not a directory: give the sink a path whose parents are directories"
    ),
    "org.apache.hadoop.fs.UnsupportedFileSystemException": (
        "use a scheme Hadoop has a file system for: a local path, file://, s3a://, hdfs://, or add the jar of "
        "that file system to pyspark's jars"
    ),
    "java.lang.ClassNotFoundException": (
        "add the jar that holds the class to pyspark's jars, or its Maven coordinate to spark.jars.packages "
        "in spark.conf (EFO_SPARK__CONF)"
    ),
    "java.lang.NoClassDefFoundError": (
        "add the jar that holds the class to pyspark's jars, or its Maven coordinate to spark.jars.packages "
        "in spark.conf (EFO_SPARK__CONF)"
    ),
    "java.nio.file.AccessDeniedException": (
        "give this process write access to the path (on S3: s3:ListBucket on the bucket, s3:PutObject, "
        "s3:GetObject and s3:DeleteObject under the prefix; see the README's 'Deploying with Helm')"
    ),
    "org.apache.hadoop.security.AccessControlException": "give this process write access to the path",
    "org.apache.hadoop.fs.s3a.UnknownStoreException": "the bucket does not exist: create it or fix the sink's URI",
    "org.apache.spark.sql.AnalysisException": (
        "the sink's query does not fit the batch's DataFrame (its columns: the README's 'DataFrame schema')"
    ),
}
#: An S3 URI given Hadoop's ``s3`` scheme, which Hadoop 3 no longer has.
S3_ADVICE = "write to S3 with the s3a:// scheme (Hadoop's S3 file system): parquet:s3a://bucket/prefix"
TRANSIENT_ADVICE = "fix the sink (its path, permissions, the target's schema) and start again"
#: How deep a chain of Java causes is followed (a cycle or a very long chain ends there).
MAX_CAUSES = 32


@dataclass(frozen=True, slots=True)
class Cause:
    """The exception that made a sink fail: its class (Java's full name, or Python's), the first
    line of its message, whether a retry meets it again, and what to do."""

    kind: str
    message: str
    permanent: bool
    advice: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


def cause_of(exc: BaseException) -> Cause:
    """The cause of a sink's exception: for an exception of the JVM (py4j's ``Py4JJavaError``, or
    pyspark's captured exceptions) the innermost Java exception of its chain, else the exception."""
    chain = _java_chain(exc)
    if chain:
        kind, message = chain[-1]
        permanent = next((name for name, _ in chain if name in PERMANENT_JAVA), None)
        if permanent is None and _is_analysis_error(exc):
            permanent = "org.apache.spark.sql.AnalysisException"
        advice = PERMANENT_JAVA[permanent] if permanent else TRANSIENT_ADVICE
        if kind == "org.apache.hadoop.fs.UnsupportedFileSystemException" and re.search(r'scheme "s3n?"', message):
            advice = S3_ADVICE
        return Cause(kind, message, permanent is not None, advice)
    message = _first_line(str(exc))
    if _is_analysis_error(exc):
        return Cause(type(exc).__name__, message, True, PERMANENT_JAVA["org.apache.spark.sql.AnalysisException"])
    return Cause(type(exc).__name__, message, False, TRANSIENT_ADVICE)


def _java_chain(exc: BaseException) -> list[tuple[str, str]]:
    """``(class name, first line of message)`` of the Java exception behind ``exc`` and each of its
    causes, outermost first; empty for an exception that did not come from the JVM."""
    throwable: Any = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    chain: list[tuple[str, str]] = []
    try:
        while throwable is not None and len(chain) < MAX_CAUSES:
            chain.append((str(throwable.getClass().getName()), _first_line(str(throwable.getMessage() or ""))))
            cause = throwable.getCause()
            throwable = None if cause is None or cause.equals(throwable) else cause
    except Exception:  # the JVM is gone (a stop): what was read so far is all there is
        pass
    return chain


def _is_analysis_error(exc: BaseException) -> bool:
    # Not imported here: without pyspark loaded (the arrow sink's path), no exception is one of its.
    errors = sys.modules.get("pyspark.errors")
    return errors is not None and isinstance(exc, errors.AnalysisException)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
