"""The simulation's clock (:class:`efo.clock.Clock`): one per worker, on the virtual-time loop.

Besides reading the loop's virtual time, it can make one worker misbehave in time as a real process
does, without touching the others that share the loop:

- :attr:`SimClock.late_s`: every timer of this worker fires that much late, as on a starved event
  loop (a sleep of 1 s takes 1 s + late, a timeout fires late, a DynamoDB answer is read late);
- :meth:`SimClock.pause`: nothing of the worker runs until a moment (a stopped VM, a long GC, a
  SIGSTOP): every timer that falls due meanwhile fires at the resume, in its order, as a process
  that wakes finds all of them overdue at once.

Unit tests use it too (with :func:`efo.sim.loop.run`): the one fake clock of every part.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: The shortest wait that moves the clock: ``now + 1e-15`` is ``now`` in floating point, and a loop that
#: waits for what is left until a deadline would wait for ever without moving.
MIN_DELAY_S = 1e-6


class SimTimer:
    __slots__ = ("_callback", "_clock", "_handle", "cancelled")

    def __init__(self, clock: SimClock, callback: Callable[[], None]) -> None:
        self._clock = clock
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self.cancelled = False

    def _at(self, when_s: float) -> None:
        self._handle = self._clock.loop.call_at(when_s, self._fire)

    def _fire(self) -> None:
        if self.cancelled:
            return
        resume_at = self._clock.paused_until
        if resume_at is not None and resume_at > self._clock.loop.time():
            self._at(resume_at)  # the process is stopped: this runs once it wakes
            return
        self.cancelled = True  # fired: a later cancel() is a no-op
        self._callback()

    def cancel(self) -> None:
        self.cancelled = True
        if self._handle is not None:
            self._handle.cancel()


class SimClock:
    def __init__(self, epoch: datetime = EPOCH, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.epoch = epoch
        self._loop = loop
        self.late_s = 0.0
        self.paused_until: float | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time()

    def wall(self) -> datetime:
        return self.epoch + timedelta(seconds=self.now())

    def pause(self, seconds: float) -> None:
        """Nothing of this worker runs for ``seconds`` from now."""
        self.paused_until = max(self.paused_until or 0.0, self.now() + seconds)

    @property
    def paused(self) -> bool:
        return self.paused_until is not None and self.paused_until > self.now()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> SimTimer:
        timer = SimTimer(self, callback)
        if 0.0 < delay_s < MIN_DELAY_S:
            delay_s = MIN_DELAY_S
        timer._at(self.now() + max(0.0, delay_s) + self.late_s)
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0 and self.late_s == 0 and not self.paused:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = self.loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float | None) -> AsyncIterator[asyncio.Timeout]:
        async with asyncio.timeout(None) as deadline:
            timer = None
            if seconds is not None:
                timer = self.call_later(seconds, lambda: deadline.reschedule(self.loop.time()))
            try:
                yield deadline
            finally:
                if timer is not None:
                    timer.cancel()


class ManualClock(SimClock):
    """A :class:`SimClock` whose time is set by hand (:attr:`t`), for a part tested without a loop.
    Its waits still run on the virtual-time loop, if one runs."""

    def __init__(self, t: float = 0.0) -> None:
        super().__init__()
        self.t = t

    def now(self) -> float:
        return self.t
