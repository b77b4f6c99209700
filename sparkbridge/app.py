"""``efo run``: the whole service in one process. Loaded lazily by the CLI (efo never imports pyspark)."""

from __future__ import annotations

from efo.config import Settings
from efo.observability import configure_logging
from efo.service import Service
from sparkbridge.driver import Driver
from sparkbridge.session import build_session
from sparkbridge.sinks import make_sink


def run(settings: Settings) -> int:
    configure_logging(settings.log.level, settings.log.format)
    sink = make_sink(settings.sink_spec)  # a bad handler fails before Spark starts
    service = Service(settings)
    service.preflight()  # a missing stream, consumer or table fails before Spark starts, too
    spark = build_session(settings.spark.master, settings.spark.conf, app_name=f"efo-{settings.app}")
    driver = Driver(spark, sink, settings, service)
    driver.install_signal_handlers()
    try:
        return driver.run()
    finally:
        spark.stop()
