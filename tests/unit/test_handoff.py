"""The handoff queue: batch bounds, order, close. Time comes from a fake clock; nothing sleeps for long."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from efo.pipeline.handoff import Handoff, HandoffClosed
from efo.pipeline.records import RecordChunk, Row

JOIN_S = 5.0  # only ever reached when a test fails


def _chunk(serial: int, records: int = 1, nbytes: int = 10, shard: str = "shard-0") -> RecordChunk:
    chunk = RecordChunk.of_rows("s", shard, serial, [Row(f"{serial}{i:04d}", b"x", "pk", 0) for i in range(records)])
    chunk.data_bytes = nbytes
    return chunk


def _frozen_clock() -> Callable[[], float]:
    return lambda: 0.0


def _clock(times: Iterator[float]) -> Callable[[], float]:
    last = [0.0]

    def now() -> float:
        last[0] = next(times, last[0])
        return last[0]

    return now


def _filled(*chunks: RecordChunk, clock: Callable[[], float] | None = None) -> Handoff:
    handoff = Handoff(clock=clock or _frozen_clock())
    for chunk in chunks:
        handoff.put(chunk)
    return handoff


def _serials(batch: list[RecordChunk]) -> list[int]:
    return [c.serial for c in batch]


def test_batch_closes_when_the_next_chunk_would_pass_max_records() -> None:
    handoff = _filled(_chunk(1, 4), _chunk(2, 4), _chunk(3, 4))
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=60)) == [1, 2]
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=0)) == [3]


def test_batch_closes_as_soon_as_it_reaches_max_records_exactly() -> None:
    handoff = _filled(_chunk(1, 5), _chunk(2, 5), _chunk(3, 1))
    # The frozen clock never reaches the deadline: only the record bound can close this batch.
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=60)) == [1, 2]


def test_batch_closes_when_the_next_chunk_would_pass_max_bytes() -> None:
    handoff = _filled(_chunk(1, nbytes=400), _chunk(2, nbytes=400), _chunk(3, nbytes=400))
    assert _serials(handoff.take_batch(max_records=10**6, max_bytes=1_000, max_wait_s=60)) == [1, 2]
    assert _serials(handoff.take_batch(max_records=10**6, max_bytes=1_000, max_wait_s=0)) == [3]


def test_batch_closes_as_soon_as_it_reaches_max_bytes_exactly() -> None:
    handoff = _filled(_chunk(1, nbytes=500), _chunk(2, nbytes=500), _chunk(3, nbytes=1))
    assert _serials(handoff.take_batch(max_records=10**6, max_bytes=1_000, max_wait_s=60)) == [1, 2]


def test_batch_closes_at_max_wait_after_its_first_chunk() -> None:
    # t=0 when the first chunk is seen (the deadline is 0 + 5), t=5 at the next look: time is up.
    handoff = _filled(_chunk(1), clock=_clock(iter([0.0, 5.0])))
    done = threading.Event()
    result: list[RecordChunk] = []

    def take() -> None:
        result.extend(handoff.take_batch(max_records=100, max_bytes=10**9, max_wait_s=5))
        done.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(JOIN_S)
    assert done.is_set(), "take_batch did not close the batch at max_wait_s"
    assert _serials(result) == [1]


def test_batch_with_zero_max_wait_returns_what_is_queued_without_waiting() -> None:
    handoff = _filled(_chunk(1), _chunk(2))
    assert _serials(handoff.take_batch(max_records=100, max_bytes=10**9, max_wait_s=0)) == [1, 2]


def test_a_taker_waiting_for_the_deadline_takes_chunks_put_meanwhile() -> None:
    about_to_wait = threading.Event()
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        if calls[0] == 2:  # the look just before it waits for more (the lock is still held)
            about_to_wait.set()
        return 0.0

    handoff = _filled(_chunk(1, 2), clock=clock)
    result: list[RecordChunk] = []
    thread = threading.Thread(
        target=lambda: result.extend(handoff.take_batch(max_records=4, max_bytes=10**9, max_wait_s=60)), daemon=True
    )
    thread.start()
    assert about_to_wait.wait(JOIN_S)
    handoff.put(_chunk(2, 2))  # acquires the lock once the taker waits; reaching 4 records closes the batch
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert _serials(result) == [1, 2]


def test_a_chunk_larger_than_max_records_forms_a_batch_of_its_own() -> None:
    handoff = _filled(_chunk(1, 1), _chunk(2, 50), _chunk(3, 1))
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=60)) == [1]
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=60)) == [2]
    assert _serials(handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=0)) == [3]


def test_a_chunk_larger_than_max_bytes_forms_a_batch_of_its_own() -> None:
    handoff = _filled(_chunk(1, nbytes=5_000), _chunk(2, nbytes=1))
    assert _serials(handoff.take_batch(max_records=10**6, max_bytes=1_000, max_wait_s=60)) == [1]
    assert _serials(handoff.take_batch(max_records=10**6, max_bytes=1_000, max_wait_s=0)) == [2]


def test_chunks_come_out_in_the_order_they_were_put_across_batches() -> None:
    handoff = _filled(*(_chunk(i, records=(i % 3) + 1) for i in range(1, 21)))
    seen: list[int] = []
    while len(seen) < 20:
        batch = handoff.take_batch(max_records=5, max_bytes=10**9, max_wait_s=0, idle_wait_s=0)
        assert batch, "queue ran dry early"
        assert sum(len(c) for c in batch) <= 5
        seen.extend(_serials(batch))
    assert seen == list(range(1, 21))


def test_take_batch_returns_nothing_when_idle() -> None:
    handoff = Handoff(clock=_frozen_clock())
    assert handoff.take_batch(max_records=10, max_bytes=10, max_wait_s=0, idle_wait_s=0) == []


def test_close_returns_the_chunks_never_taken_in_order() -> None:
    handoff = _filled(_chunk(1), _chunk(2), _chunk(3))
    assert _serials(handoff.take_batch(max_records=1, max_bytes=10**9, max_wait_s=0)) == [1]
    left = handoff.close()
    assert _serials(left) == [2, 3]
    assert handoff.take_batch(max_records=10, max_bytes=10**9, max_wait_s=0, idle_wait_s=0) == []
    assert handoff.close() == []  # already handed back once


def test_close_wakes_a_taker_waiting_for_a_first_chunk() -> None:
    handoff = Handoff(clock=_frozen_clock())
    result: list[list[RecordChunk]] = []
    thread = threading.Thread(
        target=lambda: result.append(handoff.take_batch(10, 10**9, 60, idle_wait_s=60)), daemon=True
    )
    thread.start()
    waiting = threading.Event()
    for _ in range(10_000):  # until the taker sits in Condition.wait (CPython keeps its waiters here)
        with handoff._cond:
            if handoff._cond._waiters:  # type: ignore[attr-defined]
                waiting.set()
                break
        waiting.wait(0.001)
    assert waiting.is_set()
    assert not handoff.filling  # waiting for a first chunk: no batch is open
    handoff.close()
    thread.join(JOIN_S)
    assert not thread.is_alive(), "close() did not wake the waiting taker"
    assert result == [[]]


def _taker_filling_a_batch_of(chunk: RecordChunk) -> tuple[Handoff, threading.Thread, list[RecordChunk]]:
    """A taker that took ``chunk`` and now waits (max_wait_s 60, a clock that never moves) for more."""
    about_to_wait = threading.Event()
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        if calls[0] == 2:  # the second read computes the time left: the taker is about to wait
            about_to_wait.set()
        return 0.0

    handoff = _filled(chunk, clock=clock)
    result: list[RecordChunk] = []
    thread = threading.Thread(target=lambda: result.extend(handoff.take_batch(100, 10**9, 60)), daemon=True)
    thread.start()
    assert about_to_wait.wait(JOIN_S)
    return handoff, thread, result


def test_close_wakes_a_taker_waiting_to_fill_its_batch_and_it_keeps_what_it_took() -> None:
    handoff, thread, result = _taker_filling_a_batch_of(_chunk(1))
    assert handoff.close() == []  # chunk 1 was already taken
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert _serials(result) == [1]


def test_put_after_close_raises_handoff_closed() -> None:
    handoff = Handoff(clock=_frozen_clock())
    handoff.close()
    with pytest.raises(HandoffClosed):
        handoff.put(_chunk(1))
    assert handoff.close() == []


def test_cut_closes_the_batch_being_filled_at_once_with_what_it_holds() -> None:
    handoff, thread, result = _taker_filling_a_batch_of(_chunk(1))
    handoff.cut()
    thread.join(JOIN_S)
    assert not thread.is_alive(), "cut() did not close the batch being filled"
    assert _serials(result) == [1]
    handoff.put(_chunk(2))  # the handoff stays open, and the next batch waits for its bounds again
    assert _serials(handoff.take_batch(1, 10**9, 60)) == [2]


def _take_in_thread(handoff: Handoff, *bounds: float) -> list[RecordChunk]:
    result: list[list[RecordChunk]] = []
    thread = threading.Thread(target=lambda: result.append(handoff.take_batch(*bounds)), daemon=True)  # type: ignore[arg-type]
    thread.start()
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the batch did not close"
    return result[0]


def test_a_cut_between_batches_closes_the_next_one_with_what_is_queued_and_only_that_one() -> None:
    now = [0.0]
    handoff = _filled(_chunk(1), _chunk(2), clock=lambda: now[0])
    handoff.cut()
    assert _serials(_take_in_thread(handoff, 100, 10**9, 60)) == [1, 2]  # no wait for max_wait_s
    handoff.put(_chunk(3))
    handoff.put(_chunk(4))
    times = iter([0.0, 1000.0])  # the deadline is set at 0 + 60 and has passed at the next read
    clock_reads = []
    handoff._clock = lambda: clock_reads.append(1) or next(times, 1000.0)  # type: ignore[method-assign]
    assert _serials(_take_in_thread(handoff, 100, 10**9, 60)) == [3, 4]
    assert len(clock_reads) == 2, "the old cut closed this batch too (it never reached its deadline check)"


def test_a_cut_closes_batches_at_once_until_everything_queued_at_the_cut_is_taken() -> None:
    handoff = _filled(_chunk(1), _chunk(2), _chunk(3), clock=_frozen_clock())
    handoff.cut()
    assert _serials(_take_in_thread(handoff, 2, 10**9, 60)) == [1, 2]  # closed at its bound
    assert _serials(_take_in_thread(handoff, 2, 10**9, 60)) == [3]  # the rest of the cut, at once


def test_a_cut_while_nothing_is_queued_wakes_the_idle_taker_with_nothing() -> None:
    entered = threading.Event()
    handoff = Handoff(clock=_frozen_clock())
    original = handoff._cond.wait_for

    def wait_for(predicate: Any, timeout: float | None = None) -> Any:
        entered.set()
        return original(predicate, timeout)

    handoff._cond.wait_for = wait_for  # type: ignore[method-assign]
    result: list[list[RecordChunk]] = []
    thread = threading.Thread(
        target=lambda: result.append(handoff.take_batch(100, 10**9, 60, idle_wait_s=60)), daemon=True
    )
    thread.start()
    assert entered.wait(JOIN_S)
    handoff.cut()
    thread.join(JOIN_S)
    assert not thread.is_alive() and result == [[]]


def _count_notifies(handoff: Handoff) -> list[int]:
    notified = [0]
    original = handoff._cond.notify

    def notify(n: int = 1) -> None:
        notified[0] += 1
        original(n)

    handoff._cond.notify = notify  # type: ignore[method-assign]
    return notified


@pytest.mark.parametrize("bound", ["records", "bytes"])
def test_a_batch_being_filled_wakes_the_taker_once_at_its_bound_not_for_every_chunk(bound: str) -> None:
    # Bounds: 100 records, 10**9 bytes; the taker holds chunk 1 (1 record, 10 bytes).
    handoff, thread, result = _taker_filling_a_batch_of(_chunk(1))
    with handoff._cond:  # the taker holds the lock until it waits
        assert handoff.filling
    notified = _count_notifies(handoff)
    by_records = bound == "records"
    for serial in (2, 3, 4):  # 90 more records (or bytes short of the byte bound): not yet
        handoff.put(_chunk(serial, 30) if by_records else _chunk(serial, 1, nbytes=3 * 10**8))
    assert notified == [0], "the taker was woken for a chunk that could not close its batch"
    assert thread.is_alive()
    handoff.put(_chunk(5, 9) if by_records else _chunk(5, 1, nbytes=10**8 - 10))  # exactly at the bound
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the batch did not close at its bound"
    assert notified == [1]
    assert _serials(result) == [1, 2, 3, 4, 5]
    assert not handoff.filling


def test_a_chunk_that_would_pass_the_bound_wakes_the_taker_and_stays_for_the_next_batch() -> None:
    handoff, thread, result = _taker_filling_a_batch_of(_chunk(1, 50))  # bound: 100 records
    notified = _count_notifies(handoff)
    handoff.put(_chunk(2, 60))  # 110 > 100: the batch closes without it
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the batch did not close when its next chunk could not fit"
    assert notified == [1]
    assert _serials(result) == [1]
    assert len(handoff) == 1
    assert _serials(handoff.take_batch(100, 10**9, 0)) == [2]


def test_a_close_while_a_batch_is_filled_hands_back_what_it_had_not_taken() -> None:
    handoff, thread, result = _taker_filling_a_batch_of(_chunk(1))
    handoff.put(_chunk(2))  # below the bound: queued, the taker sleeps on
    assert _serials(handoff.close()) == [2]  # never taken: its budget goes back with it
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert _serials(result) == [1]
