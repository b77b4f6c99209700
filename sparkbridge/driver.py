"""The Spark driver loop: batches from the handoff -> Arrow -> DataFrame -> sink -> acknowledge.

The main thread runs Spark and owns the signals. The first SIGTERM or SIGINT stops intake,
finishes and checkpoints the running batch within ``shutdown_timeout_s`` and exits 0 (what is
still queued is not checkpointed: the next owner reads it again). A second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from types import FrameType

import structlog
from pyspark.sql import SparkSession

from efo.config import Settings
from efo.coordinator import Commit
from efo.errors import EXIT_OK, EXIT_RUNTIME, EfoError, SinkFailed
from efo.observability import METRICS
from efo.records import RecordChunk
from efo.service import Service
from sparkbridge.arrow import to_table
from sparkbridge.sinks import BatchInfo, ShardRange, Sink

log = structlog.get_logger("sparkbridge.driver")


def describe_batch(batch_id: str, chunks: Sequence[RecordChunk], attempt: int = 1) -> BatchInfo:
    shards: dict[str, ShardRange] = {}
    for chunk in chunks:
        known = shards.get(chunk.shard_id)
        first = known.first_sequence_number if known else chunk.sequence_numbers[0]
        count = (known.records if known else 0) + len(chunk)
        shards[chunk.shard_id] = ShardRange(first, chunk.sequence_numbers[-1], count)
    return BatchInfo(
        batch_id=batch_id,
        records=sum(len(c) for c in chunks),
        bytes=sum(c.data_bytes for c in chunks),
        shards=shards,
        attempt=attempt,
    )


class Driver:
    def __init__(self, spark: SparkSession, sink: Sink, settings: Settings, service: Service | None = None) -> None:
        self.spark = spark
        self.sink = sink
        self.settings = settings
        self.service = service or Service(settings)
        self.handoff = self.service.handoff
        self._stopping = threading.Event()
        self._run_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        self._batches = 0

    def request_stop(self) -> None:
        self._stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            sys.stderr.write("efo: second signal, exiting at once (uncommitted records will be read again)\n")
            os._exit(EXIT_RUNTIME)
        log.info("driver.signal", signal=signal.Signals(signum).name)
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def run(self) -> int:
        self.service.start()
        batch = self.settings.batch
        try:
            while not self._stopping.is_set() and not self.service.finished.is_set():
                chunks = self.handoff.take_batch(batch.max_records, batch.max_bytes, batch.max_wait_s)
                if chunks:
                    self.process(chunks)
        except EfoError as exc:
            self.service.request_stop()
            self.service.driver_finished()
            self.service.join(self.settings.shutdown_timeout_s)
            raise exc
        self.service.request_stop()
        self.service.driver_finished()
        if not self.service.join(self.settings.shutdown_timeout_s + 5):
            log.warning("driver.service_join_timeout")
        if self.service.error is not None:
            raise self.service.error
        log.info("driver.stopped", batches=self._batches)
        return EXIT_OK

    def process(self, chunks: list[RecordChunk]) -> None:
        self._batches += 1
        batch_id = f"{self._run_id}-{self._batches:08d}"
        started = time.monotonic()
        table = to_table(chunks)
        df = self.spark.createDataFrame(table)
        retry = self.settings.sink_retry
        for attempt in range(1, retry.max_attempts + 1):
            info = describe_batch(batch_id, chunks, attempt)
            try:
                self.sink.write(df, info)
                break
            except Exception as exc:  # any sink failure is retried, then fatal
                if attempt == retry.max_attempts:
                    raise SinkFailed(
                        f"sink failed on batch {batch_id} after {attempt} attempts: {type(exc).__name__}: {exc}"
                    ) from None
                delay_s = retry.retry_backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "sink.retry",
                    batch_id=batch_id,
                    attempt=attempt,
                    error=f"{type(exc).__name__}: {exc}",
                    delay_s=delay_s,
                )
                time.sleep(delay_s)
        self.service.commit(Commit(c.shard_id, c.serial, len(c), c.grant) for c in chunks)
        duration_s = time.monotonic() - started
        METRICS.batches_committed.inc()
        METRICS.batch_seconds.observe(duration_s)
        log.info(
            "batch.committed",
            batch_id=batch_id,
            records=info.records,
            bytes=info.bytes,
            shards=len(info.shards),
            duration_s=round(duration_s, 3),
        )
