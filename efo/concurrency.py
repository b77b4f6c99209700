"""Two shapes of concurrency a worker uses: bounded bursts of DynamoDB writes (a bootstrap's leases,
a cycle's claims, a migration), and loops that run every so often or when woken (the lease cycle,
shard discovery)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from efo.clock import Clock
from efo.errors import EfoError

T = TypeVar("T")


async def bounded(limit: int, call: Callable[[T], Awaitable[object]], items: Iterable[T]) -> None:
    """``call(item)`` for every item, at most ``limit`` under way at once; the first failure cancels
    the rest (a write cut short may have landed: every one is fenced or idempotent) and is raised as
    itself. Each call is made only once it has a slot, so a cancelled burst leaves no coroutine that
    was never awaited; no call outlives this one. (Not a TaskGroup: in Python 3.11 one whose task
    failed drops a cancellation that arrives while the others unwind, and a stop would wait for ever.)"""
    slots = asyncio.Semaphore(limit)

    async def one(item: T) -> None:
        async with slots:
            await call(item)

    tasks = [asyncio.ensure_future(one(item)) for item in items]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # a failure, or this call cancelled: the rest stop too, and are waited for
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def periodically(
    step: Callable[[], Awaitable[None]],
    *,
    interval_s: float,
    wake: asyncio.Event,
    log: Any,
    failed: str,
    clock: Clock,
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
            async with clock.timeout(interval_s):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
