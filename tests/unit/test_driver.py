"""The driver's bounds without Spark: signal handlers restored, and a watchdog that ends the process
when a sink holds the main thread past the shutdown deadline or after the service failed."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from efo.config import load_settings
from efo.errors import EfoError, ResourceNotFound
from efo.pipeline.handoff import Handoff
from efo.pipeline.records import RecordChunk, Row
from sparkbridge.arrow import to_table
from sparkbridge.driver import EXIT_GRACE_S, Driver, capture_signals, end_to_end_latencies_s
from sparkbridge.sinks import SinkCapabilities


class FakeService:
    def __init__(self) -> None:
        self.handoff = Handoff()
        self.finished = threading.Event()
        self.stopping = threading.Event()
        self.intake_ended = threading.Event()
        self.error: EfoError | None = None
        self.stops = 0

    def request_stop(self) -> None:
        self.stops += 1


class FakeRunner:
    _give_up_at: Any = None


@pytest.fixture(autouse=True)
def _no_efo_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)


def _driver(clock: list[float]) -> tuple[Driver, FakeService, list[int]]:
    settings = load_settings(stream="s", app="a", sink="console", shutdown_timeout_s=10)
    service = FakeService()
    exits: list[int] = []
    driver = Driver(FakeRunner(), settings, service, exit_process=exits.append, clock=lambda: clock[0])  # type: ignore[arg-type]
    return driver, service, exits


def _watch(driver: Driver) -> threading.Thread:
    watcher = threading.Thread(target=driver._watch, daemon=True)
    watcher.start()
    return watcher


def test_capture_signals_installs_the_handler_and_restores_the_previous_ones() -> None:
    def mine(signum: int, frame: Any) -> None:
        pass

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with capture_signals(mine):
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_stop_tells_the_service_at_once_and_sets_the_sink_deadline() -> None:
    clock = [50.0]
    driver, service, _ = _driver(clock)
    assert driver.give_up_at() is None
    driver.request_stop()
    clock[0] = 55.0
    driver.request_stop()  # a second request does not move the deadline
    assert service.stops == 2
    assert driver.give_up_at() == 60.0
    assert driver.runner._give_up_at() == 60.0


def test_the_watchdog_exits_1_once_the_deadline_passed_and_the_service_has_finished() -> None:
    clock = [0.0]
    driver, service, exits = _driver(clock)
    driver._in_sink = "b-1"  # the main thread is inside the sink
    watcher = _watch(driver)
    driver.request_stop()
    clock[0] = 10.5  # past the deadline, the sink still holds the main thread
    time.sleep(0.5)
    assert exits == [], "exited before the service had written its last checkpoints"
    service.finished.set()
    watcher.join(2)
    assert exits == [1]


def test_the_watchdog_exits_after_the_grace_even_when_the_service_does_not_finish() -> None:
    clock = [0.0]
    driver, _, exits = _driver(clock)
    watcher = _watch(driver)
    driver.request_stop()
    clock[0] = 10 + EXIT_GRACE_S + 0.1
    watcher.join(2)
    assert exits == [1]


def test_a_failed_service_stops_the_driver_and_the_watchdog_exits_with_its_code() -> None:
    clock = [0.0]
    driver, service, exits = _driver(clock)
    driver._in_sink = "b-1"
    watcher = _watch(driver)
    service.error = ResourceNotFound("consumer gone")
    service.finished.set()
    time.sleep(0.5)
    assert driver.give_up_at() == 10.0 and exits == []  # the batch in the sink may still finish
    clock[0] = 10.5
    watcher.join(2)
    assert exits == [3]


def test_a_service_stopping_on_its_own_stops_the_driver_at_once() -> None:
    """One stream's fatal error stops every stream: the others wait for the driver to be done with
    its batch, so the driver must stop as after a SIGTERM, not when the whole service has ended."""
    clock = [0.0]
    driver, service, exits = _driver(clock)
    watcher = _watch(driver)
    service.stopping.set()
    deadline = time.monotonic() + 5
    while driver.give_up_at() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert driver.give_up_at() == 10.0 and service.stops == 1 and exits == []
    driver.close()
    watcher.join(2)


def test_the_watchdog_does_nothing_once_the_driver_is_done() -> None:
    clock = [0.0]
    driver, _, exits = _driver(clock)
    watcher = _watch(driver)
    driver.close()
    watcher.join(2)
    assert not watcher.is_alive() and exits == []


def test_a_clean_stop_that_ends_just_after_the_deadline_is_not_cut_short() -> None:
    # The main thread is not in a sink: it is on its way out (joining the service, stopping Spark).
    clock = [0.0]
    driver, service, exits = _driver(clock)
    watcher = _watch(driver)
    driver.request_stop()
    service.finished.set()
    clock[0] = 10.5
    time.sleep(0.5)
    assert exits == [], "exited 1 although no batch was left in the sink"
    clock[0] = 10 + EXIT_GRACE_S + 0.1
    watcher.join(2)
    assert exits == [1]  # still bounded


def test_no_sink_attempt_starts_after_the_deadline_not_even_the_first_after_dead_letters() -> None:
    from efo.errors import SinkFailed
    from efo.pipeline.records import RecordChunk, Row
    from sparkbridge.batches import BatchRunner

    now = [0.0]
    calls: list[str] = []

    class Slow:
        capabilities = SinkCapabilities(takes_arrow=True)

        def __init__(self, name: str, seconds: float) -> None:
            self.name, self.seconds = name, seconds

        def write(self, table: Any, batch: Any) -> None:
            calls.append(self.name)
            now[0] += self.seconds

    chunk = RecordChunk.of_rows("s", "shard-0", 1, [Row("1", b"x", "k", 0)], epoch=1)
    chunk.dead_letters.append(
        type(
            "Letter",
            (),
            {"sequence_number": "0", "data": b"bad", "partition_key": "k", "arrival_ms": 0, "reason": "md5"},
        )()
    )
    runner = BatchRunner(
        None,
        Slow("sink", 0),
        max_attempts=3,
        retry_backoff_s=0,
        dead_letter_sink=Slow("dead letters", 20),  # the deadline passes while it writes
        give_up_at=lambda: 10.0,
        clock=lambda: now[0],
    )
    with pytest.raises(SinkFailed, match="deadline"):
        runner.run("b-1", [chunk])
    assert calls == ["dead letters"]


def test_end_to_end_latencies_are_seconds_from_each_record_s_arrival_to_the_commit() -> None:
    rows = [Row(str(i), b"x", "k", 1_700_000_000_000 + 250 * i) for i in range(4)]
    chunks = [RecordChunk.of_rows("s", "shard-0", 1, rows), RecordChunk.of_rows("s", "shard-1", 1, rows[:2])]
    latencies = end_to_end_latencies_s(to_table(chunks), committed_at_ms=1_700_000_001_000.0)
    assert latencies.to_pylist() == [1.0, 0.75, 0.5, 0.25, 1.0, 0.75]
    assert end_to_end_latencies_s(None, 0.0).to_pylist() == []


def _committing_driver(write: Any) -> tuple[Driver, Any]:
    from sparkbridge.batches import BatchRunner

    class Sink:
        capabilities = SinkCapabilities(takes_arrow=True)

        def write(self, table: Any, batch: Any) -> None:
            write()

    class Service(FakeService):
        def batch_started(self) -> None:
            pass

        def commit(self, commits: Any) -> None:
            list(commits)

    settings = load_settings(stream="s", app="a", sink="console")
    runner = BatchRunner(None, Sink(), max_attempts=1, retry_backoff_s=0)  # type: ignore[arg-type]
    return Driver(runner, settings, Service(), exit_process=lambda code: None), runner  # type: ignore[arg-type]


class _Proxy:  # as py4j's JavaObject and the JavaMember it caches refer to each other
    def __init__(self) -> None:
        self.member = self


def test_the_driver_collects_the_batch_s_reference_cycles_once_it_is_committed() -> None:
    """py4j's proxies of a batch's Spark objects sit in reference cycles: the JVM drops the batch
    only once Python's collector has freed them, which the driver does after each commit rather
    than leaving it to the (rare, efo.gc_tuning) automatic collections. One that a young
    collection during the batch made middle-aged goes too."""
    import gc
    import weakref

    proxies: list[weakref.ref[_Proxy]] = []

    def write() -> None:
        proxies.append(weakref.ref(proxy := _Proxy()))
        gc.collect(0)  # as a young collection during the batch would: the proxy, alive, moves up
        assert any(obj is proxy for obj in gc.get_objects(1))

    driver, runner = _committing_driver(write)
    chunk = RecordChunk.of_rows("s", "shard-0", 1, [Row("1", b"x", "k", 0)])
    enabled = gc.isenabled()
    gc.disable()
    try:
        driver.commit(runner.prepare("b-1", [chunk]))
        assert len(proxies) == 1 and proxies[0]() is None
    finally:
        if enabled:
            gc.enable()


def test_what_outlived_a_batch_and_became_garbage_later_is_collected_within_the_oldest_threshold() -> None:
    """The per-batch collection moves survivors to the oldest generation and resets the counts that
    start a full collection: every oldest-threshold-th batch collects all generations."""
    import gc
    import weakref

    kept: list[_Proxy] = []
    driver, runner = _committing_driver(lambda: kept.append(_Proxy()) if not kept else None)
    enabled = gc.isenabled()
    gc.disable()
    try:
        driver.commit(runner.prepare("b-1", [RecordChunk.of_rows("s", "shard-0", 1, [Row("1", b"x", "k", 0)])]))
        gone = weakref.ref(kept[0])
        assert any(obj is kept[0] for obj in gc.get_objects(2))  # survived a batch: the oldest generation
        kept.clear()  # garbage now, in a cycle
        for serial in range(2, 2 + gc.get_threshold()[2] + 1):
            if gone() is None:
                break
            chunk = RecordChunk.of_rows("s", "shard-0", serial, [Row(str(serial), b"x", "k", 0)])
            driver.commit(runner.prepare(f"b-{serial}", [chunk]))
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
