"""The Spark driver loop: batches from the handoff, through a :class:`BatchRunner`, acknowledged.

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
from types import FrameType

import structlog

from efo.config import Settings
from efo.errors import EXIT_OK, EXIT_RUNTIME
from efo.leases.lifecycle import Commit
from efo.observability import METRICS
from efo.service import Service
from sparkbridge.batches import BatchRunner, Prefetcher, PreparedBatch

log = structlog.get_logger("sparkbridge.driver")


class Driver:
    def __init__(self, runner: BatchRunner, settings: Settings, service: Service) -> None:
        self.runner = runner
        self.settings = settings
        self.service = service
        self.handoff = service.handoff
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
        """Take and commit batches until a stop is asked for or the service fails. The next batch
        is taken and converted to Arrow on a worker thread while Spark commits the current one."""
        self.service.start()
        prefetch = Prefetcher(self._take_and_prepare)
        try:
            while not self._stopping.is_set() and not self.service.finished.is_set():
                prepared = prefetch.next()
                if prepared is not None:
                    self.commit(prepared)
        finally:
            # Intake stops; a batch taken but not committed is read again by the next owner. The
            # service flushes what was committed, releases the leases and ends.
            self.service.request_stop()
            prefetch.close()
            self.service.driver_finished()
            if not self.service.join(self.settings.shutdown_timeout_s + 5):
                log.warning("driver.service_join_timeout")
        if self.service.error is not None:
            raise self.service.error
        log.info("driver.stopped", batches=self._batches)
        return EXIT_OK

    def _take_and_prepare(self) -> PreparedBatch | None:
        batch = self.settings.batch
        if self._stopping.is_set():
            return None
        chunks = self.handoff.take_batch(batch.max_records, batch.max_bytes, batch.max_wait_s)
        if not chunks:
            return None
        self._batches += 1
        return self.runner.prepare(f"{self._run_id}-{self._batches:08d}", chunks)

    def commit(self, prepared: PreparedBatch) -> None:
        self.service.batch_started()
        result = self.runner.commit(prepared)
        self.service.commit(Commit.of(chunk) for chunk in result.chunks)
        METRICS.batches_committed.inc()
        METRICS.batch_seconds.observe(result.duration_s)
        log.info(
            "batch.committed",
            batch_id=result.info.batch_id,
            records=result.info.records,
            bytes=result.info.bytes,
            shards=len(result.info.shards),
            duplicates=result.duplicates,
            invalid_json=result.invalid_json,
            duration_s=round(result.duration_s, 3),
        )
