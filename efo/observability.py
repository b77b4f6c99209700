"""Logging (structlog, JSON unless on a terminal) and the Prometheus metrics of the service.

Log events are dotted names with fixed keys (``stream``, ``shard_id``, ``worker_id``, ``attempt``,
``records``, ``bytes``, ``duration_s`` ...); payloads and credentials are never logged.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import platform
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO, cast

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import HistogramMetricFamily

from efo import __version__
from efo.clock import SYSTEM_CLOCK, Clock
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


#: Seconds: pool waits and checkpoint writes are short; batches and end-to-end latency are longer.
SHORT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LONG_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300)
RECORD_BUCKETS = (1, 10, 100, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000)
BYTE_BUCKETS = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28)

#: How a subscription ended (``efo_subscriptions_ended_total{outcome}``).
SUBSCRIPTION_OUTCOMES = ("renewal", "shard_end", "error", "backpressure", "stopped")
#: Why a lease changed hands at this worker (``efo_lease_changes_total{reason}``).
LEASE_CHANGES = ("taken", "stolen", "released", "handed_over", "lost", "finished")
#: ``efo_checkpoint_writes_total{outcome}``: written, fenced out (the lease moved on), failed.
CHECKPOINT_OUTCOMES = ("ok", "conflict", "error")
#: ``efo_lease_table_reads_total{rows}``: the version row, heartbeat rows, or lease partitions.
LEASE_READS = ("control", "heartbeats", "leases")


class BulkHistogram:
    """A histogram observed a whole column at a time: ``efo_end_to_end_latency_seconds`` takes
    every record of a committed batch (hundreds of thousands a second), which a per-value
    ``Histogram.observe`` in Python could not keep up with."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(bound) for bound in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket (not cumulative), the last one +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: pa.Array) -> None:
        """Count every value (seconds) of ``values`` into its bucket."""
        if len(values) == 0:
            return
        at_or_below = [int(pc.sum(pc.less_equal(values, bound)).as_py() or 0) for bound in self.bounds]
        total = float(pc.sum(values).as_py() or 0.0)
        with self._lock:
            previous = 0
            for index, cumulative in enumerate(at_or_below):
                self._counts[index] += cumulative - previous
                previous = cumulative
            self._counts[-1] += len(values) - previous
            self._sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            running += count
            cumulative.append((_bucket_label(bound), running))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], cumulative, total)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)


def _bucket_label(bound: float) -> str:
    """The ``le`` label as prometheus-client writes it: ``+Inf``, ``1.0``, ``0.25``."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class ShardSeries:
    """One claimed shard's series, bound once (an event updates them without a label lookup) and
    removed when the claim ends, so a released shard leaves no stale lag behind. Labelled by the
    stream's name and the shard id: two streams of one application have shards of the same ids."""

    def __init__(self, metrics: Metrics, stream: str, shard_id: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self._metrics = metrics
        self._clock = clock
        self._lag: Gauge | None = None  # from the first event on: no "0 s behind" for a shard never read
        labels = {"stream": stream, "shard_id": shard_id}
        self._last_event = metrics.shard_last_event.labels(**labels)
        self._records_received = metrics.records_received.labels(**labels)
        self._bytes_received = metrics.bytes_received.labels(**labels)
        self._records_committed = metrics.records_committed.labels(**labels)
        self._bytes_committed = metrics.bytes_committed.labels(**labels)
        self.lag_ms: int | None = None  # MillisBehindLatest of the last event, for the lease row
        self._lag_stopped = False  # reading stopped for good in this claim (a bounded run's cut)

    def event(self, lag_ms: int | None) -> None:
        """An event arrived (records or not), ``lag_ms`` behind the tip."""
        if lag_ms is not None and not self._lag_stopped:
            self.lag_ms = lag_ms
            if self._lag is None:
                self._lag = self._metrics.shard_lag.labels(stream=self.stream, shard_id=self.shard_id)
            self._lag.set(lag_ms / 1000)
        self._last_event.set(self._clock.wall().timestamp())

    def stop_lag(self) -> None:
        """Reading stopped here for good (a bounded run cut the shard at its time): its lag leaves
        ``efo_shard_lag_seconds``; the last one, days behind in a replay, would otherwise stay until
        the run ends and raise the lag alert. ``lag_ms`` keeps the last event's, for the lease row."""
        self._lag_stopped = True
        if self._lag is not None:
            self._lag = None
            try:
                self._metrics.shard_lag.remove(self.stream, self.shard_id)
            except KeyError:
                pass

    def received(self, records: int, nbytes: int) -> None:
        """Records handed on (admitted to the pool)."""
        self._records_received.inc(records)
        self._bytes_received.inc(nbytes)

    def committed(self, records: int, nbytes: int) -> None:
        self._records_committed.inc(records)
        self._bytes_committed.inc(nbytes)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    build_info: Info
    shard_lag: Gauge
    shard_last_event: Gauge
    records_received: Counter
    bytes_received: Counter
    records_committed: Counter
    bytes_committed: Counter
    records_duplicate: Counter
    records_invalid_json: Counter
    events_decoded_twice: Counter
    corrupt_aggregates: Counter
    subscriptions_started: Counter
    subscriptions_ended: Counter
    subscription_errors: Counter
    positions_expired: Counter
    positions_skipped: Counter
    shards_expired: Counter
    pool_records: Gauge
    pool_bytes: Gauge
    pool_capacity_records: Gauge
    pool_capacity_bytes: Gauge
    pool_wait: Histogram
    backpressure_timeouts: Counter
    handoff_chunks: Gauge
    leases_held: Gauge
    lease_changes: Counter
    lease_reads: Counter
    workers_live: Gauge
    stream_reading: Gauge
    shards_unowned: Gauge
    run_shards_remaining: Gauge
    checkpoint_writes: Counter
    checkpoint_write_seconds: Histogram
    batches_committed: Counter
    batch_records: Histogram
    batch_bytes: Histogram
    batch_seconds: Histogram
    end_to_end_latency: BulkHistogram
    sink_failures: Counter
    sink_retries: Counter
    ready: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        registry = registry or CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        shard = ["stream", "shard_id"]
        stream = ["stream"]  # the stream's name (efo.config.stream_name), on what each stream does apart
        metrics = cls(
            registry=registry,
            build_info=Info("efo_build", "The running build.", registry=registry),
            shard_lag=Gauge(
                "efo_shard_lag_seconds",
                "How far the shard's last event was behind the tip (MillisBehindLatest).",
                shard,
                registry=registry,
            ),
            shard_last_event=Gauge(
                "efo_shard_last_event_timestamp_seconds",
                "When the shard's last event arrived (Unix time).",
                shard,
                registry=registry,
            ),
            records_received=Counter(
                "efo_records_received_total",
                "Records read from Kinesis (after deaggregation).",
                shard,
                registry=registry,
            ),
            bytes_received=Counter("efo_bytes_received_total", "Record payload bytes read.", shard, registry=registry),
            records_committed=Counter(
                "efo_records_committed_total",
                "Records committed by the sink.",
                shard,
                registry=registry,
            ),
            bytes_committed=Counter(
                "efo_bytes_committed_total",
                "Record payload bytes committed by the sink.",
                shard,
                registry=registry,
            ),
            records_duplicate=Counter(
                "efo_records_duplicate_total",
                "Records dropped as already delivered.",
                registry=registry,
            ),
            records_invalid_json=Counter(
                "efo_records_invalid_json_total",
                "Rows whose data did not parse as JSON (kept, error set).",
                registry=registry,
            ),
            events_decoded_twice=Counter(
                "efo_events_decoded_twice_total",
                "Events of small records that msgspec refused and orjson decoded: a field or value it does not "
                "know, child shards or corrupt input; each costs a second parse.",
                registry=registry,
            ),
            corrupt_aggregates=Counter(
                "efo_corrupt_aggregates_total",
                "KPL aggregates that did not decode.",
                stream,
                registry=registry,
            ),
            subscriptions_started=Counter(
                "efo_subscriptions_started_total",
                "SubscribeToShard calls that opened a stream.",
                stream,
                registry=registry,
            ),
            subscriptions_ended=Counter(
                "efo_subscriptions_ended_total",
                "Subscriptions that ended, by outcome: renewal (the 5-minute limit or a server close), "
                "shard_end, error, backpressure (paused for pool budget), stopped (released or lost).",
                [*stream, "outcome"],
                registry=registry,
            ),
            subscription_errors=Counter(
                "efo_subscription_errors_total",
                "Failed subscriptions, by AWS error code.",
                [*stream, "code"],
                registry=registry,
            ),
            positions_expired=Counter(
                "efo_positions_expired_total",
                "Starting positions older than the stream's retention: the shard restarted at TRIM_HORIZON "
                "(records between them were lost to retention).",
                stream,
                registry=registry,
            ),
            positions_skipped=Counter(
                "efo_positions_skipped_total",
                "Shards started at AT_TIMESTAMP(now - skip_older_than) because their checkpoint was older.",
                stream,
                registry=registry,
            ),
            shards_expired=Counter(
                "efo_shards_expired_total",
                "Shards gone from the stream (past retention) before they were finished; marked finished.",
                stream,
                registry=registry,
            ),
            pool_records=Gauge("efo_pool_pending_records", "Records holding pool budget.", registry=registry),
            pool_bytes=Gauge("efo_pool_pending_bytes", "Bytes holding pool budget.", registry=registry),
            pool_capacity_records=Gauge("efo_pool_capacity_records", "The pool's bound in records.", registry=registry),
            pool_capacity_bytes=Gauge("efo_pool_capacity_bytes", "The pool's bound in bytes.", registry=registry),
            pool_wait=Histogram(
                "efo_pool_wait_seconds",
                "How long an event waited for pool budget.",
                buckets=SHORT_BUCKETS_S,
                registry=registry,
            ),
            backpressure_timeouts=Counter(
                "efo_backpressure_timeouts_total",
                "Waits for pool budget longer than pool.backpressure_timeout_s (the subscription paused).",
                registry=registry,
            ),
            handoff_chunks=Gauge(
                "efo_handoff_queue_chunks",
                "Chunks waiting in the handoff queue for the driver, those of the batch being filled included.",
                registry=registry,
            ),
            leases_held=Gauge("efo_leases_held", "Leases of the stream this worker holds.", stream, registry=registry),
            lease_changes=Counter(
                "efo_lease_changes_total",
                "Lease changes at this worker, by reason: taken (free or expired), stolen (asked of a live "
                "worker), released (at a stop), handed_over (to a worker that asked), lost, finished (SHARD_END).",
                [*stream, "reason"],
                registry=registry,
            ),
            lease_reads=Counter(
                "efo_lease_table_reads_total",
                "Reads of the lease table by the lease cycle, by what they read: control (the version row, "
                "every cycle), heartbeats (the watched workers' rows, every cycle, or every row: when who is "
                "alive changed, and about every minute) or leases (one lease partition: when its version "
                "moved, and the safety net).",
                [*stream, "rows"],
                registry=registry,
            ),
            stream_reading=Gauge(
                "efo_stream_reading",
                "1 while the stream is read here; 0 once it stopped being read while the others go on "
                "(deleted while running).",
                stream,
                registry=registry,
            ),
            workers_live=Gauge(
                "efo_workers_live",
                "Workers with a live heartbeat for the stream in the lease table.",
                stream,
                registry=registry,
            ),
            shards_unowned=Gauge(
                "efo_shards_unowned",
                "Shards of the stream that can be read but have no live owner (this worker's last view).",
                stream,
                registry=registry,
            ),
            run_shards_remaining=Gauge(
                "efo_run_shards_remaining",
                "A bounded run (run.until): shards of the stream this worker holds or could claim that have not "
                "reached the run's end yet (0 once done, and without run.until).",
                stream,
                registry=registry,
            ),
            checkpoint_writes=Counter(
                "efo_checkpoint_writes_total",
                "Checkpoint writes by outcome: ok, conflict (the lease moved on), error (retried later).",
                [*stream, "outcome"],
                registry=registry,
            ),
            checkpoint_write_seconds=Histogram(
                "efo_checkpoint_write_seconds",
                "Latency of checkpoint writes.",
                buckets=SHORT_BUCKETS_S,
                registry=registry,
            ),
            batches_committed=Counter(
                "efo_batches_committed_total",
                "Batches committed by the sink.",
                registry=registry,
            ),
            batch_records=Histogram(
                "efo_batch_records",
                "Records per committed batch.",
                buckets=RECORD_BUCKETS,
                registry=registry,
            ),
            batch_bytes=Histogram(
                "efo_batch_bytes",
                "Record payload bytes per committed batch.",
                buckets=BYTE_BUCKETS,
                registry=registry,
            ),
            batch_seconds=Histogram(
                "efo_batch_duration_seconds",
                "From taking a batch to its commit (Arrow, DataFrame, sink).",
                buckets=LONG_BUCKETS_S,
                registry=registry,
            ),
            end_to_end_latency=BulkHistogram(
                "efo_end_to_end_latency_seconds",
                "From a record's arrival in Kinesis (ApproximateArrivalTimestamp) to its commit by the sink.",
                LONG_BUCKETS_S,
                registry,
            ),
            sink_failures=Counter("efo_sink_failures_total", "Sink attempts that raised.", registry=registry),
            sink_retries=Counter(
                "efo_sink_retries_total",
                "Sink attempts after the first for a batch.",
                registry=registry,
            ),
            ready=Gauge("efo_ready", "1 while /readyz answers 200.", registry=registry),
        )
        metrics.build_info.info({"version": __version__, "python_version": platform.python_version()})
        return metrics

    def add_stream(self, stream: str) -> None:
        """Start the series of a stream read (``stream``: its name) at 0: every outcome and reason is
        there before it first happens (an ``increase()`` sees the first one), and the dashboard's
        ``$stream`` lists the stream from its start."""
        for outcome in SUBSCRIPTION_OUTCOMES:
            self.subscriptions_ended.labels(stream=stream, outcome=outcome)
        for reason in LEASE_CHANGES:
            self.lease_changes.labels(stream=stream, reason=reason)
        for outcome in CHECKPOINT_OUTCOMES:
            self.checkpoint_writes.labels(stream=stream, outcome=outcome)
        for rows in LEASE_READS:
            self.lease_reads.labels(stream=stream, rows=rows)
        for family in self.per_stream():
            family.labels(stream=stream)

    def per_stream(self) -> tuple[Counter | Gauge, ...]:
        """The families labelled by ``stream`` alone."""
        return (
            self.corrupt_aggregates,
            self.subscriptions_started,
            self.positions_expired,
            self.positions_skipped,
            self.shards_expired,
            self.leases_held,
            self.workers_live,
            self.shards_unowned,
            self.run_shards_remaining,
        )

    def stream_gone(self, stream: str) -> None:
        """A stream deleted while running is read no more: ``efo_stream_reading`` 0 (the alert), and
        its state gauges leave, so that no alert fires on this worker's last view of it."""
        self.stream_reading.labels(stream=stream).set(0)
        for family in (self.leases_held, self.workers_live, self.shards_unowned, self.run_shards_remaining):
            try:
                family.remove(stream)
            except KeyError:
                pass

    def shard(self, stream: str, shard_id: str, clock: Clock = SYSTEM_CLOCK) -> ShardSeries:
        return ShardSeries(self, stream, shard_id, clock)

    def forget_shard(self, stream: str, shard_id: str) -> None:
        """Remove a released shard's series (a later claim starts them again)."""
        for family in (
            self.shard_lag,
            self.shard_last_event,
            self.records_received,
            self.bytes_received,
            self.records_committed,
            self.bytes_committed,
        ):
            try:
                family.remove(stream, shard_id)
            except KeyError:
                pass


METRICS = Metrics.create()


def metrics_table(metrics: Metrics = METRICS) -> str:
    """The README's metrics table, from the metrics themselves (a test keeps the two equal)."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(metrics):
        metric = getattr(metrics, field.name)
        if isinstance(metric, CollectorRegistry):
            continue
        for family in metric.describe():
            suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
            labels = ", ".join(f"`{label}`" for label in getattr(metric, "_labelnames", ())) or "-"
            labels = "`version`, `python_version`" if family.type == "info" else labels
            kind = "gauge" if family.type == "info" else family.type
            rows.append(f"| `{family.name}{suffix}` | {kind} | {labels} | {family.documentation} |")
    rows.append("| `process_*`, `python_*` | | | the process's CPU, memory, file descriptors, GC (prometheus-client) |")
    return "\n".join(rows)
