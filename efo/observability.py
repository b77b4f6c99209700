"""Logging (structlog, JSON unless on a terminal) and the Prometheus metrics of the service.

Log events are dotted names with fixed keys (``stream``, ``shard_id``, ``worker_id``, ``attempt``,
``records``, ``bytes``, ``duration_s`` ...); payloads and credentials are never logged.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TextIO, cast

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from efo.stderr_json import JsonLinesStream, wants_json


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """Configure structlog once; route the standard library (botocore, py4j) and Python warnings
    through it too. With JSON output, any other line written to ``sys.stderr`` becomes JSON as well."""
    json_output = wants_json(fmt)
    stream = getattr(sys.stderr, "wrapped", sys.stderr)  # the real stream, also when called again
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "aiobotocore", "py4j", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    logging.captureWarnings(True)
    sys.stderr = cast(TextIO, JsonLinesStream(stream)) if json_output else stream


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    records_received: Counter
    records_committed: Counter
    records_duplicate: Counter
    records_invalid_json: Counter
    corrupt_aggregates: Counter
    checkpoints_written: Counter
    subscriptions_started: Counter
    subscription_errors: Counter
    positions_expired: Counter
    positions_skipped: Counter
    shards_expired: Counter
    batches_committed: Counter
    batch_seconds: Histogram
    shards_owned: Gauge
    pool_records: Gauge
    pool_bytes: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        registry = registry or CollectorRegistry()
        return cls(
            registry=registry,
            records_received=Counter("efo_records_received_total", "Records read from Kinesis.", registry=registry),
            records_committed=Counter(
                "efo_records_committed_total", "Records committed by the sink.", registry=registry
            ),
            records_duplicate=Counter(
                "efo_records_duplicate_total", "Records dropped as already delivered.", registry=registry
            ),
            records_invalid_json=Counter(
                "efo_records_invalid_json_total",
                "Rows whose data did not parse as JSON (kept, error set).",
                registry=registry,
            ),
            corrupt_aggregates=Counter(
                "efo_corrupt_aggregates_total", "KPL aggregates that did not decode.", registry=registry
            ),
            checkpoints_written=Counter("efo_checkpoints_written_total", "Checkpoint writes.", registry=registry),
            subscriptions_started=Counter(
                "efo_subscriptions_started_total", "SubscribeToShard calls that opened a stream.", registry=registry
            ),
            subscription_errors=Counter(
                "efo_subscription_errors_total", "Failed subscriptions, by error code.", ["code"], registry=registry
            ),
            positions_expired=Counter(
                "efo_positions_expired_total",
                "Starting positions older than the stream's retention: the shard restarted at TRIM_HORIZON "
                "(records between them were lost to retention).",
                registry=registry,
            ),
            positions_skipped=Counter(
                "efo_positions_skipped_total",
                "Shards started at AT_TIMESTAMP(now - skip_older_than) because their checkpoint was older.",
                registry=registry,
            ),
            shards_expired=Counter(
                "efo_shards_expired_total",
                "Shards gone from the stream (past retention) before they were finished; marked finished.",
                registry=registry,
            ),
            batches_committed=Counter(
                "efo_batches_committed_total", "Batches committed by the sink.", registry=registry
            ),
            batch_seconds=Histogram(
                "efo_batch_duration_seconds",
                "From taking a batch to its commit (Arrow, DataFrame, sink).",
                buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
                registry=registry,
            ),
            shards_owned=Gauge("efo_shards_owned", "Shards this worker reads.", registry=registry),
            pool_records=Gauge("efo_pool_pending_records", "Records holding pool budget.", registry=registry),
            pool_bytes=Gauge("efo_pool_pending_bytes", "Bytes holding pool budget.", registry=registry),
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)


METRICS = Metrics.create()
