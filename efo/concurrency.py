"""Bounded concurrency for bursts of DynamoDB writes (a bootstrap's leases, a cycle's claims, a migration)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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
