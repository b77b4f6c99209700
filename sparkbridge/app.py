"""``efo run``: the whole service in one process. Loaded lazily by the CLI (efo never imports pyspark).

Users who already have a SparkSession call :func:`run_with_session` with theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

from efo import gc_tuning, preflight
from efo.config import Settings, SinkSpec
from efo.errors import EfoError
from efo.health import HealthServer
from efo.observability import configure_logging
from efo.service import Service
from sparkbridge.batches import BatchRunner, ValueDecoder
from sparkbridge.driver import Driver
from sparkbridge.filesystems import require_filesystems, require_writable, sink_paths
from sparkbridge.session import build_session
from sparkbridge.sinks import Sink, make_sink, takes_arrow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(settings: Settings) -> int:
    """The start checks before it changes anything: the sink's module (no AWS call), the stream,
    consumer and table (read-only, before Spark: seconds), then Spark and the sink's path (a test
    write); only then does it register a consumer or create a table that are missing."""
    configure_logging(settings.log.level, settings.log.format)
    sink = make_sink(settings.sink_spec, settings.partition_columns)  # a bad sink fails before Spark starts
    plan = preflight.inspect(settings)  # a missing stream, consumer or table fails before Spark starts, too
    service = Service(settings)
    if takes_arrow(sink):  # arrow:<module>:<function> is handed Arrow tables: no JVM at all
        _prepare(service, plan, settings)
        with _serving(settings, service):
            service.health.ready_check("spark", lambda: None)
            gc_tuning.tune()  # start-up is over: the process is efo's
            return _drive(_driver(None, sink, settings, service), install_signals=True)
    # The JVM starts before any thread of ours (pyspark forks it with a preexec_fn, unsafe with
    # threads running): the HTTP server comes after it, and the startup probe covers the wait.
    spark = build_session(settings, app_name=f"efo-{settings.app}")
    try:
        paths = sink_paths(settings)
        require_filesystems(spark, paths)  # before any record is read
        require_writable(spark, paths)
        _prepare(service, plan, settings)  # the consumer and the table, once everything else holds
    except EfoError:
        spark.stop()
        raise
    with _serving(settings, service):
        service.health.ready_check("spark", lambda: session_problem(spark))
        gc_tuning.tune()  # start-up is over: the process is efo's
        return _drive(_driver(spark, sink, settings, service), install_signals=True, then=spark.stop)


def run_with_session(
    spark: SparkSession, settings: Settings, sink: Sink | None = None, *, install_signals: bool = False
) -> int:
    """Run the service on the caller's SparkSession, which stays open. From the main thread,
    ``install_signals=True`` lets efo own SIGTERM/SIGINT (graceful drain, second signal exits)
    until it returns; the caller's handlers are restored then. The garbage collector is the
    caller's too: :func:`efo.gc_tuning.tune` sets it as ``efo run`` does."""
    paths = sink_paths(settings, main_sink=sink is None)
    require_filesystems(spark, paths)
    plan = preflight.inspect(settings)
    require_writable(spark, paths)
    service = Service(settings)
    with _serving(settings, service):
        _prepare(service, plan, settings)
        own = sink is not None  # the caller's sink: its errors are not named after EFO_SINK
        sink = sink or make_sink(settings.sink_spec, settings.partition_columns)
        service.health.ready_check("spark", lambda: session_problem(spark))
        return _drive(_driver(spark, sink, settings, service, own_sink=own), install_signals=install_signals)


def _prepare(service: Service, plan: preflight.Plan, settings: Settings) -> None:
    """The start's changes (a consumer registered, a table created, if missing) and the checks of the
    table's rows; a failure after a change says what it changed and how to undo it."""
    try:
        service.preflight()
    except EfoError as error:
        raise plan.after_failure(settings, error) from None


@contextmanager
def _serving(settings: Settings, service: Service) -> Iterator[None]:
    """/metrics, /healthz and /readyz on ``metrics_port`` (0: none) while the service lives."""
    if not settings.metrics_port:
        yield
        return
    server = HealthServer(service.health, port=settings.metrics_port).start()
    try:
        yield
    finally:
        server.close()


def session_problem(spark: SparkSession) -> str | None:
    """/readyz: the session is up (read from Python state: no call into the JVM or the server)."""
    context = getattr(spark, "_sc", None)  # classic Spark: None once stopped
    if context is not None and getattr(context, "_jsc", None) is None:
        return "the Spark session is stopped"
    if getattr(spark, "is_stopped", False):  # Spark Connect
        return "the Spark Connect session is stopped"
    return None


def _driver(
    spark: SparkSession | None, sink: Sink, settings: Settings, service: Service, *, own_sink: bool = False
) -> Driver:
    runner = BatchRunner(
        spark,
        sink,
        max_attempts=settings.sink_retry.max_attempts,
        retry_backoff_s=settings.sink_retry.retry_backoff_s,
        decoder=ValueDecoder(settings.value_format, settings.json_schema),  # parsing the DDL needs a session
        dead_letter_sink=make_sink(SinkSpec.parse(settings.dead_letter_sink)) if settings.dead_letter_sink else None,
        labels={
            "sink": f"sink {type(sink).__name__}" if own_sink else f"sink (EFO_SINK) = {settings.sink!r}",
            "dead_letter_sink": f"dead_letter_sink (EFO_DEAD_LETTER_SINK) = {settings.dead_letter_sink!r}",
        },
    )
    return Driver(runner, settings, service)


def _drive(driver: Driver, *, install_signals: bool, then: Callable[[], object] | None = None) -> int:
    """Run the driver; ``then`` (stopping Spark) runs after it, still under the driver's watchdog,
    so that the whole shutdown stays bounded by shutdown_timeout_s."""
    try:
        with driver.capture_signals() if install_signals else nullcontext():
            return driver.run()
    finally:
        try:
            if then is not None:
                then()
        finally:
            driver.close()
