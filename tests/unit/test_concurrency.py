"""efo.concurrency alone: bursts and loops end when their task is cancelled, also while a failure
in a burst is unwinding (a stop must never wait for ever on the lease cycle)."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from efo.concurrency import bounded, periodically
from efo.errors import EfoError, Retriable
from efo.sim.clock import SimClock
from efo.sim.loop import run as run_virtual

BURSTS: list[int] = []


async def _burst() -> None:
    BURSTS.append(1)
    if len(BURSTS) > 50:  # a loop that never ends would hang the test: end it, failed
        raise EfoError("too many bursts")

    async def call(item: int) -> None:
        if item == 0:
            raise Retriable("ProvisionedThroughputExceededException")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # slow to unwind, like a request being torn down
            raise

    await bounded(4, call, range(3))


def test_a_loop_cancelled_while_a_failed_burst_unwinds_ends_instead_of_retrying() -> None:
    BURSTS.clear()

    async def scenario() -> None:
        loop = asyncio.ensure_future(
            periodically(
                _burst,
                interval_s=0.01,
                wake=asyncio.Event(),
                log=structlog.get_logger(),
                failed="test.failed",
                clock=SimClock(),
            )
        )
        await asyncio.sleep(0.05)  # the first burst failed and its siblings are unwinding
        loop.cancel()
        done, _ = await asyncio.wait({loop}, timeout=2.0)
        assert loop in done, "the loop went on after it was cancelled"
        assert loop.cancelled()

    run_virtual(scenario())


def test_a_burst_raises_its_first_failure_as_itself() -> None:
    BURSTS.clear()
    with pytest.raises(Retriable):
        asyncio.run(_burst())
