"""When the next batch is prepared: taken at once, one call ahead of the driver, and converted
once this batch's DataFrame is made (sparkbridge.batches.Prefetcher, BatchRunner.commit's
``frame_ready``), so its conversion does not hold the GIL while ``createDataFrame`` runs Python.
No Spark here: a runner whose DataFrame is the Arrow table itself."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from efo.config import load_settings
from efo.errors import EfoError
from efo.pipeline.handoff import Handoff
from efo.pipeline.records import RecordChunk, Row
from efo.service import Service
from sparkbridge.batches import BatchRunner, Prefetcher, PreparedBatch
from sparkbridge.driver import Driver
from sparkbridge.sinks import SinkCapabilities


def chunk(serial: int, rows: int = 2) -> RecordChunk:
    return RecordChunk.of_rows(
        "s", "shard-0", serial, [Row(str(serial * 100 + i), b"x", "k", 0) for i in range(rows)], epoch=1
    )


class Counting:
    """A ``produce`` that numbers its calls, signals each start and each conversion (the part
    after its turn), and refuses to convert when its turn is refused."""

    def __init__(self) -> None:
        self.calls = 0
        self.conversions = 0
        self.refused = 0
        self.started = threading.Semaphore(0)
        self.converting = threading.Semaphore(0)
        self.go = threading.Event()
        self.go.set()

    def __call__(self, turn: Callable[[], bool]) -> int:
        self.calls += 1
        number = self.calls
        self.started.release()
        if not turn():
            self.refused += 1
            return -number
        self.converting.release()
        assert self.go.wait(5)
        self.conversions += 1
        return number


def test_the_next_call_starts_at_once_and_converts_on_its_turn() -> None:
    produce = Counting()
    prefetch = Prefetcher(produce)
    try:
        assert prefetch.next() == 1  # the first call converts at once
        assert produce.started.acquire(timeout=5) and produce.converting.acquire(timeout=5)  # the first call's
        assert produce.started.acquire(timeout=5), "the next call did not start at once"
        assert not produce.converting.acquire(timeout=0.2), "the next call converted before its turn"
        prefetch.start_next()
        prefetch.start_next()  # given already: nothing more
        assert produce.converting.acquire(timeout=5)
        assert prefetch.next() == 2
        assert prefetch.next() == 3  # its turn given by next() itself
        assert produce.started.acquire(timeout=5) and produce.started.acquire(timeout=5)  # calls 3 and 4
    finally:
        closer = threading.Thread(target=prefetch.close)  # call 4 waits for its turn: refused
        closer.start()
        closer.join(5)
        prefetch.start_next()  # had close() not given the turn, the worker would keep the process
    assert not closer.is_alive(), "close() waits for a call whose turn it did not refuse"
    assert (produce.calls, produce.conversions, produce.refused) == (4, 3, 1)


def test_close_waits_for_the_conversion_under_way() -> None:
    produce = Counting()
    prefetch = Prefetcher(produce)
    assert prefetch.next() == 1
    assert produce.converting.acquire(timeout=5)  # the first call's
    produce.go.clear()
    prefetch.start_next()
    assert produce.converting.acquire(timeout=5)  # the second call's, held
    closer = threading.Thread(target=prefetch.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close() returned while a conversion was under way"
    produce.go.set()
    closer.join(5)
    assert not closer.is_alive()
    assert (produce.calls, produce.conversions, produce.refused) == (2, 2, 0)


class ArrowSink:
    capabilities = SinkCapabilities(takes_arrow=True)

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def write(self, table: Any, batch: Any) -> None:
        self.events.append(f"write {batch.batch_id}")


def test_a_sink_taking_arrow_or_a_batch_without_rows_lets_the_next_batch_start_at_once() -> None:
    events: list[str] = []
    runner = BatchRunner(None, ArrowSink(events), max_attempts=1, retry_backoff_s=0)
    runner.commit(runner.prepare("b-1", [chunk(1)]), frame_ready=lambda: events.append("frame ready"))
    again = runner.prepare("b-2", [chunk(1)])  # the same rows again: all dropped by the watermark
    assert again.table is None
    runner.commit(again, frame_ready=lambda: events.append("frame ready"))
    assert events == ["frame ready", "write b-1", "frame ready"]


class FrameRunner(BatchRunner):
    """A DataFrame sink's runner whose 'DataFrame' is the table (no Spark), noting whether the
    next batch was under way while the frame was made."""

    def __init__(self, sink: Any, events: list[str], handoff: Handoff | None = None) -> None:
        super().__init__(None, sink, max_attempts=2, retry_backoff_s=0, sleep=lambda s: None)
        self.events = events
        self.handoff = handoff
        self.prepares = 0
        self.frames = 0

    def prepare(self, batch_id: str, chunks: list[RecordChunk]) -> PreparedBatch:
        self.prepares += 1
        return super().prepare(batch_id, chunks)

    def _frame(self, sink: Any, table: pa.Table) -> Any:
        self.frames += 1
        time.sleep(0.1)  # as createDataFrame's Python work: time for the next batch to start, were it let
        self.events.append("frame" if self.prepares == self.frames else "frame beside the next batch's prepare")
        if self.handoff is not None:
            self.events.append(f"{len(self.handoff)} chunks left to take")
        return table


class FailingOnce:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def write(self, df: Any, batch: Any) -> None:
        self.events.append(f"write attempt {batch.attempt}")
        if batch.attempt == 1:
            raise OSError("sink down")


def test_a_dataframe_sink_lets_the_next_batch_start_once_its_frame_is_made_and_once_across_retries() -> None:
    events: list[str] = []
    runner = FrameRunner(FailingOnce(events), events)
    runner.commit(runner.prepare("b-1", [chunk(1)]), frame_ready=lambda: events.append("frame ready"))
    assert events == ["frame", "frame ready", "write attempt 1", "write attempt 2"]


class DriverService:
    """What Driver.run uses of the service: a handoff, its events, commits counted."""

    def __init__(self, batches: int) -> None:
        self.handoff = Handoff()
        self.finished = threading.Event()
        self.stopping = threading.Event()
        self.intake_ended = threading.Event()
        self.error = None
        self.stopped_before_end = False
        self.commits = 0
        self._batches = batches

    def start(self) -> None:
        pass

    def request_stop(self) -> None:
        self.intake_ended.set()  # it reads nothing more at once

    def batch_started(self) -> None:
        pass

    def commit(self, commits: Any) -> None:
        list(commits)
        self.commits += 1
        if self.commits == self._batches:
            self.stopping.set()

    def driver_finished(self) -> None:
        self.finished.set()

    def join(self, timeout_s: float | None = None) -> bool:
        return True


def test_the_driver_takes_the_next_batch_at_once_and_converts_it_once_the_sink_s_dataframe_is_made() -> None:
    events: list[str] = []
    service = DriverService(batches=3)
    for serial in (1, 2, 3):
        service.handoff.put(chunk(serial))
    settings = load_settings(stream="s", app="a", sink="console", batch={"max_records": 2, "max_wait_s": 0.05})

    class Sink:
        def write(self, df: Any, batch: Any) -> None:
            # The next batch (if there is one: 3 were written) is prepared while this one is in the sink.
            deadline = time.monotonic() + 5
            while runner.frames < 3 and runner.prepares == runner.frames and time.monotonic() < deadline:
                time.sleep(0.01)
            events.append("write beside the next batch's prepare" if runner.prepares > runner.frames else "write")

    runner = FrameRunner(Sink(), events, service.handoff)
    driver = Driver(runner, settings, service, exit_process=lambda code: None)  # type: ignore[arg-type]
    try:
        assert driver.run() == 0
    finally:
        driver.close()  # its watchdog
    assert service.commits == 3
    beside = "write beside the next batch's prepare"
    # The next batch taken before this one's frame (only the third chunk left at the first),
    # converted while it is in the sink, not while its frame is made.
    assert events == [
        *("frame", "1 chunks left to take", beside),
        *("frame", "0 chunks left to take", beside),
        *("frame", "0 chunks left to take", "write"),
    ]


def test_on_a_quiet_stream_a_record_arriving_while_the_sink_writes_is_taken_at_once() -> None:
    """The take after a batch found nothing within idle_wait_s (0.5 s): it takes again, so the
    record's batch closes max_wait_s after it arrived, not after the commit."""
    service = DriverService(batches=2)
    service.handoff.put(chunk(1))
    settings = load_settings(stream="s", app="a", sink="console", batch={"max_records": 2, "max_wait_s": 0.05})
    left: list[int] = []

    class Sink:
        capabilities = SinkCapabilities(takes_arrow=True)
        writes = 0

        def write(self, table: Any, batch: Any) -> None:
            self.writes += 1
            if self.writes == 1:
                time.sleep(0.8)  # the take beside this write found nothing within its idle wait
                service.handoff.put(chunk(2))
                time.sleep(0.5)
                left.append(len(service.handoff))

    runner = BatchRunner(None, Sink(), max_attempts=1, retry_backoff_s=0)
    driver = Driver(runner, settings, service, exit_process=lambda code: None)  # type: ignore[arg-type]
    try:
        assert driver.run() == 0
    finally:
        driver.close()
    assert service.commits == 2
    assert left == [0], "the record waited in the handoff for the commit before it"


@pytest.mark.parametrize("end", ["handoff closed", "service stopping", "intake ended"])
def test_the_take_ends_once_the_handoff_is_closed_or_the_service_reads_nothing_more(end: str) -> None:
    service = DriverService(batches=1)
    settings = load_settings(stream="s", app="a", sink="console")
    runner = BatchRunner(None, ArrowSink([]), max_attempts=1, retry_backoff_s=0)
    driver = Driver(runner, settings, service, exit_process=lambda code: None)  # type: ignore[arg-type]
    results: list[Any] = []
    taker = threading.Thread(target=lambda: results.append(driver._take_and_prepare(lambda: True)), daemon=True)
    taker.start()
    try:
        time.sleep(0.7)  # past one idle wait: it takes again
        assert taker.is_alive()
        if end == "handoff closed":
            service.handoff.close()
        elif end == "service stopping":
            service.stopping.set()
        else:  # after a stop
            driver._stopping.set()
            service.intake_ended.set()
        taker.join(2)
        assert not taker.is_alive() and results == [None]
    finally:  # a loop that did not end would spin on through the tests after
        service.finished.set()
        service.handoff.close()
        taker.join(5)


def test_after_a_stop_the_driver_commits_what_the_service_reads_on_until_its_intake_ends() -> None:
    """A stop right after a subscription: the service reads on until Kinesis would take the next
    owner's call (Coordinator._read_on). What it reads meanwhile must reach the sink and the final
    checkpoint, so the driver takes batches until the service's intake has ended, not until the signal."""
    service = DriverService(batches=0)
    service.request_stop = lambda: None  # type: ignore[method-assign]  # this service reads on
    settings = load_settings(stream="s", app="a", sink="console", batch={"max_records": 2, "max_wait_s": 0.05})
    runner = BatchRunner(None, ArrowSink([]), max_attempts=1, retry_backoff_s=0)
    driver = Driver(runner, settings, service, exit_process=lambda code: None)  # type: ignore[arg-type]
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(driver.run()), daemon=True)
    try:
        running.start()
        driver.request_stop()  # the signal
        for serial in (1, 2):  # read after it
            service.handoff.put(chunk(serial))
            deadline = time.monotonic() + 5
            while service.commits < serial and time.monotonic() < deadline:
                time.sleep(0.01)
        assert service.commits == 2 and running.is_alive()
        service.intake_ended.set()
        running.join(5)
        assert not running.is_alive() and codes == [0]
    finally:
        service.intake_ended.set()
        driver.close()


def test_a_bounded_run_s_end_lets_the_driver_commit_everything_queued() -> None:
    """At a bounded run's end the service stops reading (its intake ends) with no stop asked for:
    the driver must take and commit everything queued until the service has finished, or the run
    ends incomplete."""
    service = DriverService(batches=0)
    for serial in range(1, 6):
        service.handoff.put(chunk(serial))
    service.handoff.cut()
    service.intake_ended.set()
    settings = load_settings(stream="s", app="a", sink="console", batch={"max_records": 2, "max_wait_s": 0.05})
    runner = BatchRunner(None, ArrowSink([]), max_attempts=1, retry_backoff_s=0)
    driver = Driver(runner, settings, service, exit_process=lambda code: None)  # type: ignore[arg-type]
    running = threading.Thread(target=driver.run, daemon=True)
    try:
        running.start()
        deadline = time.monotonic() + 5
        while service.commits < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(service.handoff) == 0 and service.commits == 5, service.commits  # a batch per chunk of 2
        assert running.is_alive()
    finally:
        service.finished.set()
        running.join(5)
        driver.close()


class ReadingOn(Service):
    """A service whose stop reads on until the driver is done, as Coordinator._read_on does (at most
    ``read_on_s``), then ends its intake."""

    read_on_s = 5.0

    async def _serve(self) -> None:
        assert self._stop is not None and self._driver_done is not None
        await self._stop.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._driver_done.wait(), self.read_on_s)
        self.intake_ended.set()
        await self._driver_done.wait()


def test_a_driver_whose_sink_failed_ends_at_once_while_the_service_reads_on() -> None:
    """The loop ended (the sink raised): nothing more will be committed, so the next batch's take
    must end at once, not when the service's intake ends (its stop reads on until the driver is
    done: the driver would wait for itself, up to the read-on's 5 s)."""
    settings = load_settings(stream="s", app="a", sink="console", batch={"max_records": 2, "max_wait_s": 0.05})
    service = ReadingOn(settings)

    class Failing:
        capabilities = SinkCapabilities(takes_arrow=True)

        def write(self, table: Any, batch: Any) -> None:
            time.sleep(0.3)  # the next batch's take is under way
            raise RuntimeError("the sink failed")

    driver = Driver(BatchRunner(None, Failing(), max_attempts=1, retry_backoff_s=0), settings, service)
    service.handoff.put(chunk(1))
    started = time.monotonic()
    try:
        with pytest.raises(EfoError, match="the sink failed"):
            driver.run()
        assert time.monotonic() - started < service.read_on_s / 2
    finally:
        driver.close()
