"""Pool reserves, pause and wait_for_room: a hot shard cannot starve a quiet one."""

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


def test_wait_for_room_returns_when_budget_is_released_without_taking_any() -> None:
    async def scenario() -> None:
        pool = PendingPool(10, 1_000)
        grant = await pool.acquire(10, 10)
        room = asyncio.ensure_future(pool.wait_for_room(5, 5))
        await _settle()
        assert not room.done()
        pool.release(grant)
        await asyncio.wait_for(room, 1)
        assert pool.records == 0

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
