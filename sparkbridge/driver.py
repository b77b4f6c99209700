"""The Spark driver loop: batches from the handoff, through a :class:`BatchRunner`, acknowledged.

The main thread runs Spark and owns the signals. The first SIGTERM or SIGINT stops intake (the
service's subscriptions may read on for up to 5 s, and the driver commits what they read); the
batch in the sink may finish and be checkpointed until ``shutdown_timeout_s`` after the signal (no
new sink attempt starts after that); then the service checkpoints what was committed, releases
the leases and the process exits: 0 when everything taken was committed, 1 when a batch was
not (its records are read again by the next owner). A second signal exits at once.

Bounded in every case: a sink that never returns cannot keep the process. A watchdog thread
ends the process shortly after the deadline, and also when the service failed while the sink
still holds the main thread (a stalled batch, a consumer deregistered under it).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from efo.config import Settings
from efo.coordinator import FINAL_WRITES_TIMEOUT_S
from efo.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_RUNTIME, EfoError
from efo.leases.lifecycle import Commit
from efo.observability import METRICS
from efo.pipeline.records import RecordChunk
from efo.service import Service
from sparkbridge.arrow import warm_up
from sparkbridge.batches import BatchRunner, Prefetcher, PreparedBatch

log = structlog.get_logger("sparkbridge.driver")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: After the shutdown deadline: time for the service's last checkpoints and releases, then exit.
EXIT_GRACE_S = FINAL_WRITES_TIMEOUT_S + 2.0
WATCH_INTERVAL_S = 0.2


def end_to_end_latencies_s(table: pa.Table | None, committed_at_ms: float) -> pa.Array:
    """Per row of the batch's ``table`` (None: no row), seconds from its arrival in Kinesis to
    ``committed_at_ms``, from the table's own arrival column (one Arrow column)."""
    if table is None:
        return pa.array([], pa.float64())
    arrivals = pc.cast(pc.cast(table.column("approximate_arrival_timestamp"), pa.int64()), pa.float64())
    elapsed_ms = pc.subtract(pa.scalar(committed_at_ms, pa.float64()), arrivals)
    return pc.divide(elapsed_ms, 1000.0).combine_chunks()


@contextmanager
def capture_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Install ``handler`` for SIGTERM and SIGINT and restore the previous handlers on exit."""
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Driver:
    def __init__(
        self,
        runner: BatchRunner,
        settings: Settings,
        service: Service,
        *,
        exit_process: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.settings = settings
        self.service = service
        self.handoff = service.handoff
        self._stopping = threading.Event()
        self._closing = threading.Event()  # the loop has ended: nothing more is committed
        self._stop_lock = threading.Lock()
        self._stop_at: float | None = None
        self._done = threading.Event()
        self._exit_process = exit_process
        self._clock = clock
        self._run_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        self._batches = 0
        self._in_sink: str | None = None  # the batch id the sink is writing
        self._warmed_up = False  # Arrow's one-time start-up memory, paid before the first record (warm_up)
        runner._give_up_at = self.give_up_at

    def request_stop(self) -> None:
        """Stop intake (the service stops reading, after at most 5 s: Coordinator._read_on, and the
        driver commits what it reads until then); the sink has until the deadline."""
        with self._stop_lock:
            if self._stop_at is None:
                self._stop_at = self._clock()
        self._stopping.set()
        self.service.request_stop()

    def give_up_at(self) -> float | None:
        """No sink attempt starts after this: ``shutdown_timeout_s`` after the stop was asked for."""
        stop_at = self._stop_at
        return None if stop_at is None else stop_at + self.settings.shutdown_timeout_s

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            sys.stderr.write("efo: second signal, exiting at once (uncommitted records will be read again)\n")
            os._exit(EXIT_RUNTIME)
        log.info("driver.signal", signal=signal.Signals(signum).name)
        self.request_stop()

    def capture_signals(self) -> Any:
        """SIGTERM/SIGINT stop this driver for as long as the context lasts."""
        return capture_signals(self._on_signal)

    def run(self) -> int:
        """Take and commit batches until the service reads nothing more (after a stop) or fails. The next batch
        is taken on a worker thread while Spark commits the current one, and converted to Arrow
        there once the current one's DataFrame is made (Prefetcher)."""
        self.service.start()
        watchdog = threading.Thread(target=self._watch, name="efo-watchdog", daemon=True)
        watchdog.start()
        prefetch = Prefetcher(self._take_and_prepare)
        try:
            prepared: PreparedBatch | None = None
            while not self._intake_over():
                # Let go of the batch just committed before the one after next is prepared: its
                # payload block is then free for it (sparkbridge.batches.BatchRunner.blocks).
                prepared = None
                prepared = prefetch.next()
                if prepared is not None:
                    self.commit(prepared, frame_ready=prefetch.start_next)
        finally:
            # Intake stops; a batch taken but not committed is read again by the next owner. The
            # service flushes what was committed, releases the leases and ends.
            self.request_stop()
            self._closing.set()  # the batch being taken now is not committed: its take ends at once
            self.handoff.cut()
            prefetch.close()
            self.service.driver_finished()
            if not self.service.join(self.settings.shutdown_timeout_s + EXIT_GRACE_S):
                log.warning("driver.service_join_timeout")
        if self.service.error is not None:
            raise self.service.error
        log.info("driver.stopped", batches=self._batches)
        if self.service.stopped_before_end:
            if self.service.incomplete == "max_duration":
                sys.stderr.write(
                    f"efo: the run (--until {self.settings.run.until}) reached run.max_duration_s "
                    f"({self.settings.run.max_duration_s:g} s) before its end; what was read is checkpointed: "
                    f"run it again to go on (exit {EXIT_INCOMPLETE})\n"
                )
            elif self.service.incomplete == "final_writes":
                sys.stderr.write(
                    f"efo: the run (--until {self.settings.run.until}) could not write every final checkpoint "
                    "or release every lease (see leases.release_incomplete); run it again once those leases "
                    f"expire (lease.failover_s): what was not checkpointed is read again (exit {EXIT_INCOMPLETE})\n"
                )
            else:
                sys.stderr.write(
                    f"efo: stopped before the end of the run (--until {self.settings.run.until}); what was read is "
                    f"checkpointed: run it again to finish (exit {EXIT_INCOMPLETE})\n"
                )
            return EXIT_INCOMPLETE
        return EXIT_OK

    def close(self) -> None:
        """The process is on its way out (Spark stopped too): the watchdog's work is done."""
        self._done.set()

    def _watch(self) -> None:
        """End the process when the main thread cannot: it is inside a sink that does not return."""
        while not self._done.wait(WATCH_INTERVAL_S):
            if self._service_ending():
                self.request_stop()  # the service is gone or going: the batch in the sink may still finish
            give_up_at = self.give_up_at()
            if give_up_at is None:
                continue
            now = self._clock()
            stuck_in_sink = self._in_sink is not None and now > give_up_at and self.service.finished.is_set()
            if stuck_in_sink or now > give_up_at + EXIT_GRACE_S:
                self._exit(self._exit_reason())
                return

    def _exit_reason(self) -> EfoError:
        error = self.service.error
        if error is not None:
            return error
        return EfoError(
            f"the sink did not finish batch {self._in_sink} within shutdown_timeout_s "
            f"({self.settings.shutdown_timeout_s:g} s); what it holds was not checkpointed and will be read again"
        )

    def _exit(self, error: EfoError) -> None:
        log.error("driver.exit", error=str(error), batch_id=self._in_sink)
        sys.stderr.write(f"efo: {error}\n")
        sys.stderr.flush()
        self._exit_process(error.exit_code or EXIT_RUNTIME)

    def _take_and_prepare(self, turn: Callable[[], bool]) -> PreparedBatch | None:
        """The next batch taken at once, converted once ``turn()`` allows (Prefetcher)."""
        if not self._warmed_up:  # on the thread that builds every table, before it takes the first batch
            warm_up()
            self._warmed_up = True
        batch = self.settings.batch
        chunks: list[RecordChunk] = []
        # On a quiet stream, take again: a record that arrives while the sink writes is taken at
        # once, and its batch closes max_wait_s after it, not after the commit. Each take waits
        # for a first record idle_wait_s at most; the end of intake or a closed handoff ends the loop.
        while not chunks and not (self.handoff.closed or self._closing.is_set() or self._intake_over()):
            chunks = self.handoff.take_batch(batch.max_records, batch.max_bytes, batch.max_wait_s)
        if not chunks or not turn():  # closing: a batch taken is read again by the next owner
            return None
        self._batches += 1
        return self.runner.prepare(f"{self._run_id}-{self._batches:08d}", chunks)

    def _intake_over(self) -> bool:
        """Nothing more to take: after a stop, once the service's subscriptions stopped (a driver
        that stopped at the signal would leave what they read in their last seconds to the next
        owner); or the service ends or stops on its own. A bounded run's end stops the reading
        with no stop asked for: everything queued is taken until the service has finished."""
        return (self._stopping.is_set() and self.service.intake_ended.is_set()) or self._service_ending()

    def _service_ending(self) -> bool:
        return self.service.finished.is_set() or self.service.stopping.is_set()

    def commit(self, prepared: PreparedBatch, frame_ready: Callable[[], None] = lambda: None) -> None:
        self._in_sink = prepared.batch_id
        self.service.batch_started()
        result = self.runner.commit(prepared, frame_ready)
        self._in_sink = None
        committed_at_ms = time.time() * 1000
        self.service.commit(Commit.of(chunk) for chunk in result.chunks)
        METRICS.batches_committed.inc()
        METRICS.batch_seconds.observe(result.duration_s)
        METRICS.batch_records.observe(result.info.records)
        METRICS.batch_bytes.observe(result.info.bytes)
        # What the sink got: rows dropped as already delivered carry an earlier arrival, not a latency.
        METRICS.end_to_end_latency.observe_many(end_to_end_latencies_s(prepared.table, committed_at_ms))
        # The batch's Spark objects are garbage now, but py4j's proxies sit in reference cycles
        # (a JavaObject and its cached JavaMembers), and only a collection lets the JVM drop what
        # they hold: the batch's DataFrame and its data. With efo.gc_tuning's rare collections
        # the JVM kept batches longer and spent 10x more CPU on its own garbage collection
        # (bench/service_cpu.py, Parquet sink). A collection of the young and middle generations
        # catches what the batch made (unless something still held it then); it also moves every
        # survivor to the oldest generation and resets the counts that would start a full
        # collection, so once the oldest generation's count reaches its threshold (every 11th
        # batch, or sooner) all generations are collected, as CPython would: what outlived a
        # batch and became cyclic garbage later is freed too. After start-up is frozen these walk
        # only what was made since (a full one per batch cost the driver's thread 0.007 CPU-s
        # per 10,000 records).
        gc.collect(2 if gc.get_count()[2] >= gc.get_threshold()[2] else 1)
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
