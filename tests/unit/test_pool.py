"""The pending pool without reserves: FIFO admission by records and bytes, oversize, cancel, release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from efo.pipeline.pool import Grant, PendingPool


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_requests_within_budget_are_admitted_at_once_and_counted() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        first = await pool.acquire(4, 100)
        second = await pool.acquire(6, 900)
        assert (first.records, first.bytes, second.records, second.bytes) == (4, 100, 6, 900)
        assert (pool.records, pool.bytes) == (10, 1_000)

    _run(scenario)


def test_record_budget_makes_a_request_wait_even_with_bytes_to_spare() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000_000)
        held = await pool.acquire(8, 10)
        waiter = asyncio.ensure_future(pool.acquire(3, 10))
        await _settle()
        assert not waiter.done()
        pool.release(held)
        await _settle()
        assert waiter.done()
        assert (pool.records, pool.bytes) == (3, 10)

    _run(scenario)


def test_byte_budget_makes_a_request_wait_even_with_records_to_spare() -> None:
    async def scenario() -> None:
        pool = PendingPool(1_000_000, 1_000)
        held = await pool.acquire(1, 900)
        assert pool.can_admit(1, 100)
        assert not pool.can_admit(1, 101)
        waiter = asyncio.ensure_future(pool.acquire(1, 101))
        await _settle()
        assert not waiter.done()
        pool.release(held)
        await _settle()
        assert waiter.done()

    _run(scenario)


def test_release_admits_waiters_in_arrival_order() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(10, 10)
        admitted: list[str] = []

        async def wait(name: str, records: int) -> None:
            await pool.acquire(records, 1)
            admitted.append(name)

        tasks = [asyncio.ensure_future(wait(name, 3)) for name in ("a", "b", "c")]
        await _settle()
        assert admitted == []
        pool.release(held)
        await _settle()
        assert admitted == ["a", "b", "c"]
        await asyncio.gather(*tasks)

    _run(scenario)


def test_release_admits_only_as_many_waiters_as_fit_and_the_rest_wait() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(10, 10)
        waiters = [asyncio.ensure_future(pool.acquire(4, 1)) for _ in range(3)]
        await _settle()
        pool.release(held)
        await _settle()
        assert [w.done() for w in waiters] == [True, True, False]
        assert pool.records == 8
        pool.release(waiters[0].result())
        await _settle()
        assert waiters[2].done()

    _run(scenario)


def test_a_large_waiter_at_the_head_blocks_later_smaller_requests_that_would_fit() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(6, 10)
        big = asyncio.ensure_future(pool.acquire(8, 10))  # does not fit next to the 6 held
        await _settle()
        assert not pool.can_admit(1, 1)  # would fit, but may not pass the queue
        small = asyncio.ensure_future(pool.acquire(1, 1))
        await _settle()
        assert not big.done()
        assert not small.done()
        pool.release(held)
        await _settle()
        assert big.done() and small.done()
        assert pool.records == 9

    _run(scenario)


def test_a_smaller_later_waiter_is_not_admitted_by_a_partial_release_before_the_head() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        first = await pool.acquire(5, 1)
        second = await pool.acquire(5, 1)
        big = asyncio.ensure_future(pool.acquire(9, 1))
        small = asyncio.ensure_future(pool.acquire(2, 1))
        await _settle()
        pool.release(first)  # 5 free: enough for small, not for big
        await _settle()
        assert not big.done()
        assert not small.done()
        pool.release(second)
        await _settle()
        assert big.done()
        assert not small.done()  # 9 + 2 > 10
        pool.release(big.result())
        await _settle()
        assert small.done()

    _run(scenario)


def test_an_event_larger_than_the_whole_pool_is_admitted_alone_once_the_pool_is_empty() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        held = await pool.acquire(2, 10)
        oversize = asyncio.ensure_future(pool.acquire(50, 5_000))
        await _settle()
        assert not oversize.done()
        after = asyncio.ensure_future(pool.acquire(1, 1))
        await _settle()
        pool.release(held)
        await _settle()
        assert oversize.done()
        assert (pool.records, pool.bytes) == (50, 5_000)
        assert not after.done()  # nothing joins the oversize event
        pool.release(oversize.result())
        await _settle()
        assert after.done()
        assert (pool.records, pool.bytes) == (1, 1)

    _run(scenario)


def test_an_oversize_event_into_an_empty_pool_is_admitted_immediately() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        grant = await asyncio.wait_for(pool.acquire(11, 2_000), 1)
        assert grant.records == 11
        pool.release(grant)
        assert (pool.records, pool.bytes) == (0, 0)

    _run(scenario)


def test_a_cancelled_waiter_is_removed_and_lets_the_next_waiter_in() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(5, 1)
        blocked_head = asyncio.ensure_future(pool.acquire(8, 1))
        behind = asyncio.ensure_future(pool.acquire(5, 1))  # fits now, but queued behind the head
        await _settle()
        assert not blocked_head.done() and not behind.done()
        blocked_head.cancel()
        await _settle()
        assert blocked_head.cancelled()
        assert behind.done()
        assert pool.records == 10  # the cancelled request took nothing
        pool.release(held)
        pool.release(behind.result())
        assert pool.records == 0

    _run(scenario)


def test_a_waiter_cancelled_just_after_admission_returns_its_budget() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(10, 1)
        waiter = asyncio.ensure_future(pool.acquire(4, 1))
        await _settle()
        pool.release(held)  # admits the waiter (future resolved) ...
        waiter.cancel()  # ... and it is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (pool.records, pool.bytes) == (0, 0)

    _run(scenario)


def test_a_release_right_after_a_waiter_is_cancelled_neither_fails_nor_leaks_budget() -> None:
    async def scenario() -> tuple[BaseException | None, list[object], tuple[int, int, int]]:
        pool = PendingPool(10, 10_000)
        held = await pool.acquire(10, 1)
        waiter = asyncio.ensure_future(pool.acquire(5, 1))
        await _settle()
        waiter.cancel()  # e.g. a shard dropped on lease loss ...
        release_error: BaseException | None = None
        try:
            pool.release(held)  # ... while a commit returns budget, in the same loop step
        except BaseException as exc:
            release_error = exc
        outcome = await asyncio.gather(waiter, return_exceptions=True)
        return release_error, outcome, (pool.records, pool.bytes, len(pool._waiters))

    release_error, outcome, usage = asyncio.run(scenario())
    assert release_error is None, f"release() raised {release_error!r}"
    assert isinstance(outcome[0], asyncio.CancelledError), f"the cancelled acquire ended with {outcome[0]!r}"
    assert usage == (0, 0, 0), "budget leaked"


def test_release_is_idempotent() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        first = await pool.acquire(3, 30)
        second = await pool.acquire(4, 40)
        pool.release(first)
        pool.release(first)
        pool.release(first)
        assert first.released
        assert (pool.records, pool.bytes) == (4, 40)
        pool.release(second)
        pool.release(second)
        assert (pool.records, pool.bytes) == (0, 0)

    _run(scenario)


def test_releasing_a_grant_twice_does_not_admit_a_waiter_that_does_not_fit() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        first = await pool.acquire(5, 1)
        await pool.acquire(5, 1)
        waiter = asyncio.ensure_future(pool.acquire(10, 1))
        await _settle()
        pool.release(first)
        pool.release(first)  # a second release would wrongly "free" 5 more
        await _settle()
        assert not waiter.done()
        assert pool.records == 5

    _run(scenario)


def test_grant_records_its_size_and_owner() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        grant = await pool.acquire(2, 20, "shard-1")
        assert grant == Grant(2, 20, "shard-1", admitted=True, released=False)

    _run(scenario)
