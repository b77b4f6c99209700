"""Two shapes of concurrency a worker uses: bounded bursts of DynamoDB writes (a bootstrap's leases,
a cycle's claims, a migration), and loops that run every so often or when woken (the lease cycle,
shard discovery)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from efo.errors import EfoError


async def bounded(limit: int, calls: list[Coroutine[Any, Any, object]]) -> None:
    """Run ``calls`` with at most ``limit`` under way at once; the first failure cancels the rest
    (a claim cut short may have landed: the next cycle finds it ours and not running, and takes it
    back) and is raised as itself."""
    slots = asyncio.Semaphore(limit)

    async def one(call: Coroutine[Any, Any, object]) -> None:
        async with slots:
            await call

    try:
        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(one(call))
    except* EfoError as failures:
        raise failures.exceptions[0] from None


async def periodically(
    step: Callable[[], Awaitable[None]], *, interval_s: float, wake: asyncio.Event, log: Any, failed: str
) -> None:
    """``step()`` every ``interval_s`` and whenever ``wake`` is set, until cancelled; a retriable
    failure is logged as the event ``failed`` and tried again at the next turn, any other ends it."""
    while True:
        try:
            await step()
        except EfoError as exc:
            if not exc.retriable:
                raise
            log.warning(failed, error=str(exc), code=exc.code)
        try:
            async with asyncio.timeout(interval_s):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
