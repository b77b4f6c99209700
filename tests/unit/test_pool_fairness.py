"""Pool reserves, pause, deadlines and bounded waits: a hot shard cannot starve a quiet one, and
no request waits behind the others for ever."""

from __future__ import annotations

import asyncio

import pytest

from efo.pipeline.pool import PendingPool


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_quiet_shard_is_admitted_from_its_reserve_while_a_hot_shard_waits_for_shared_budget() -> None:
    async def scenario() -> None:
        pool = PendingPool(100, 10_000, reserved_records=10, reserved_bytes=1_000)
        pool.register("hot")
        pool.register("quiet")
        hot = await pool.acquire(80, 800, "hot")  # 80 + quiet's unused reserve 10 = 90 of 100
        waiting_hot = asyncio.ensure_future(pool.acquire(15, 100, "hot"))
        await _settle()
        assert not waiting_hot.done()
        quiet = await asyncio.wait_for(pool.acquire(5, 50, "quiet"), 1)  # passes the queued hot request
        assert quiet.records == 5
        pool.release(hot)
        await _settle()
        assert waiting_hot.done()

    asyncio.run(scenario())


def test_shared_budget_leaves_the_unused_reserves_of_other_shards_alone() -> None:
    async def scenario() -> None:
        pool = PendingPool(100, 10_000, reserved_records=10, reserved_bytes=1_000)
        for owner in ("a", "b", "c"):
            pool.register(owner)
        assert pool.can_admit(80, 10, "a")  # 100 - reserves of b and c
        await pool.acquire(1, 1, "a")
        assert not pool.can_admit(80, 10, "a")  # 1 + 80 + 20 held > 100
        assert pool.can_admit(79, 10, "a")

    asyncio.run(scenario())


def test_reserves_shrink_so_that_together_they_take_at_most_half_the_pool() -> None:
    pool = PendingPool(100, 1_000, reserved_records=50, reserved_bytes=500)
    for i in range(10):
        pool.register(f"s{i}")
    assert pool.reserve() == (5, 50)


def test_paused_pool_admits_nothing_until_resumed() -> None:
    async def scenario() -> None:
        pool = PendingPool(100, 10_000, reserved_records=10, reserved_bytes=1_000)
        pool.register("a")
        pool.pause()
        waiting = asyncio.ensure_future(pool.acquire(1, 1, "a"))
        await _settle()
        assert not waiting.done() and not pool.can_admit(1, 1, "a")
        pool.resume()
        await _settle()
        assert waiting.done() and pool.records == 1

    asyncio.run(scenario())


def test_acquire_with_a_deadline_raises_timeout_holding_nothing_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        held = await pool.acquire(10, 10)
        with pytest.raises(TimeoutError):
            await pool.acquire(5, 5, timeout_s=0.01)
        behind = asyncio.ensure_future(pool.acquire(5, 5))
        pool.release(held)
        await asyncio.wait_for(behind, 1)
        assert pool.records == 5

    asyncio.run(scenario())


def test_a_deadline_passing_as_the_budget_is_granted_returns_the_budget() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        held = await pool.acquire(10, 10)
        waiter = asyncio.ensure_future(pool.acquire(4, 4, timeout_s=0.05))
        await _settle()
        await asyncio.sleep(0.049)
        pool.release(held)  # granted in the loop pass in which the deadline may fire
        try:
            grant = await waiter
        except TimeoutError:
            assert pool.records == 0
        else:
            assert grant.admitted and pool.records == 4

    asyncio.run(scenario())


def test_a_cancel_in_the_same_loop_pass_as_the_grant_cancels_and_returns_the_budget() -> None:
    # asyncio.wait_for on Python 3.11 returns the result and swallows such a cancel: the shard task
    # then kept reading after shutdown had cancelled it.
    async def scenario() -> None:
        pool = PendingPool(1, 1 << 30)
        held = await pool.acquire(1, 1)
        waiter = asyncio.ensure_future(pool.acquire(1, 1, timeout_s=30))
        await _settle()
        pool.release(held)
        waiter.cancel()
        await _settle()
        assert waiter.cancelled()
        assert pool.records == 0

    asyncio.run(scenario())


def test_try_acquire_admits_at_once_or_returns_none() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        first = pool.try_acquire(8, 8)
        assert first is not None and first.admitted and pool.records == 8
        assert pool.try_acquire(3, 3) is None
        assert pool.records == 8

    asyncio.run(scenario())


def test_shrink_gives_the_surplus_of_a_grant_back_and_admits_waiters() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        grant = await pool.acquire(10, 100)
        waiter = asyncio.ensure_future(pool.acquire(4, 40))
        await _settle()
        pool.shrink(grant, 6, 60)
        await asyncio.wait_for(waiter, 1)
        assert (grant.records, grant.bytes) == (6, 60)
        assert (pool.records, pool.bytes) == (10, 100)
        pool.release(grant)
        assert (pool.records, pool.bytes) == (4, 40)

    asyncio.run(scenario())


def test_an_event_that_needs_an_empty_pool_gets_in_while_other_shards_keep_reading_from_reserves() -> None:
    # 90 records never fit beside the other two shards' reserves (100 - 2 x 10): only an empty pool
    # takes them. Other shards reading from their reserves used to keep the pool from ever emptying.
    async def scenario() -> None:
        pool = PendingPool(100, 1 << 30, reserved_records=10, reserved_bytes=1 << 20)
        for owner in ("a", "b", "big"):
            pool.register(owner)
        a = await pool.acquire(5, 5, "a")
        b = await pool.acquire(5, 5, "b")
        big = asyncio.ensure_future(pool.acquire(90, 90, "big"))
        cycles = 0
        while not big.done():
            assert cycles < 3, "the big event was passed by reserve admissions for ever"
            cycles += 1
            pool.release(a)
            next_a = asyncio.ensure_future(pool.acquire(5, 5, "a"))
            pool.release(b)
            next_b = asyncio.ensure_future(pool.acquire(5, 5, "b"))
            await _settle()
            a, b = await asyncio.wait_for(asyncio.gather(next_a, next_b), 1)
        assert cycles == 1
        assert big.result().admitted

    asyncio.run(scenario())


def test_a_request_that_fits_beside_the_reserves_does_not_stop_reserve_admissions() -> None:
    async def scenario() -> None:
        pool = PendingPool(100, 1 << 30, reserved_records=10, reserved_bytes=1 << 20)
        for owner in ("a", "b", "c"):
            pool.register(owner)
        shared = await pool.acquire(70, 70, "c")
        waiter = asyncio.ensure_future(pool.acquire(20, 20, "c"))  # 70 + 20 + 20 held > 100: waits
        await _settle()
        assert not waiter.done()
        quiet = await asyncio.wait_for(pool.acquire(5, 5, "a"), 1)  # from a's reserve, past the waiter
        assert quiet.admitted
        pool.release(shared)
        await asyncio.wait_for(waiter, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize("owners", [1, 3])
def test_oversize_event_is_admitted_alone_into_an_empty_pool_with_reserves(owners: int) -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 100, reserved_records=2, reserved_bytes=20)
        for i in range(owners):
            pool.register(f"s{i}")
        grant = await asyncio.wait_for(pool.acquire(50, 5_000, "s0"), 1)
        assert pool.records == 50
        pool.release(grant)
        assert pool.records == 0

    asyncio.run(scenario())


def test_a_shard_unregistered_with_budget_in_flight_is_forgotten_once_that_budget_comes_back() -> None:
    # A shard lost to another worker with chunks in the sink: its late commits return the budget.
    # Until then its reserve counts; afterwards it must not (10 phantom owners shrink every reserve).
    async def scenario() -> None:
        pool = PendingPool(1_000, 1 << 30, reserved_records=100, reserved_bytes=1 << 20)
        owners = [f"s{i}" for i in range(10)]
        for owner in owners:
            pool.register(owner)
        in_flight = [await pool.acquire(10, 10, owner) for owner in owners[2:]]
        for owner in owners[2:]:
            pool.unregister(owner)  # lost, with 10 records each still in the sink
        for grant in in_flight:
            pool.release(grant)  # the late commits
        held = await pool.acquire(200, 200, "s0")
        assert pool.reserve() == (100, 1 << 20)  # two owners left: the full reserve
        assert pool.try_acquire(600, 600, "s1") is not None, "phantom owners still hold their reserves"
        pool.release(held)

    asyncio.run(scenario())
