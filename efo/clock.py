"""Every source of time a worker uses, in one object handed to every part.

A part never calls ``time.monotonic``, ``datetime.now``, ``asyncio.sleep``, ``asyncio.timeout`` or
``loop.call_later`` itself: it asks its :class:`Clock`. In production that is :data:`SYSTEM_CLOCK`
(the event loop's own time and the system's wall clock); in the fleet simulation
(:mod:`efo.sim`) and in unit tests it is a clock on an event loop whose time is virtual, which can
also run one worker's timers late or hold them while the worker is paused. So the same code runs
in production, in a unit test and in a simulated fleet of hundreds of workers. The service hands
its clock to every part it makes (``efo.service.Service(clock=...)``). Outside a worker's event
loop the system clock is used directly: the settings' checks at load, the driver thread's handoff
(a thread's condition waits in real time) and the Spark source's engine (``efo.source``).

- :meth:`Clock.now`: monotonic seconds (intervals, deadlines, ages), never compared across hosts;
- :meth:`Clock.wall`: the wall clock, for what is written to the table or compared with Kinesis's
  arrival times (``updated_at``, AT_TIMESTAMP positions, ``skip_older_than``);
- :meth:`Clock.sleep`, :meth:`Clock.timeout`, :meth:`Clock.call_later`: every wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: only differences of two readings mean anything."""
        ...

    def wall(self) -> datetime:
        """The wall clock (timezone-aware, UTC)."""
        ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        """``asyncio.timeout``'s contract: ``TimeoutError`` when the block outlasts ``seconds``."""
        ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        """``callback()`` on the running loop after ``delay_s``."""
        ...


class SystemClock:
    """The production clock: the event loop's time (``time.monotonic``) and the system's wall clock.
    ``now`` and ``wall`` may be read from any thread (the health server's)."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(seconds)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay_s, callback)


SYSTEM_CLOCK: Clock = SystemClock()


def wall_ms(clock: Clock) -> int:
    """The wall clock in epoch milliseconds (Kinesis's arrival times are)."""
    return int(clock.wall().timestamp() * 1000)
