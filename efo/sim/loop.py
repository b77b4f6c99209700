"""An asyncio event loop whose time is virtual: it moves only when every task waits.

The simulation has no real I/O (its DynamoDB, its Kinesis and every worker's sink are in-process
objects that answer after a simulated latency), so whenever no callback is ready the loop jumps its
clock straight to the next timer instead of sleeping. Minutes of a fleet run in seconds, and since
one thread runs everything in a fixed order, a run is a function of its seed.

``asyncio.sleep``, ``asyncio.timeout``, ``asyncio.wait_for`` and ``loop.call_later`` all work
unchanged on it. Nothing may wait for a thread or a socket: with nothing scheduled and a task still
waiting, the loop raises :class:`Deadlock` rather than wait for ever.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits, and nothing is scheduled that could wake one."""


class _NoSelector(selectors.BaseSelector):
    """Instead of waiting for I/O, move the loop's clock to the next timer."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise Deadlock(f"every task waits and no timer is scheduled (virtual time {self._loop.time():.3f} s)")
        if timeout > 0:
            self._loop.advance_to_next_timer()
        return []

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise RuntimeError("the virtual-time loop has no I/O")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise RuntimeError("the virtual-time loop has no I/O")

    def get_map(self) -> Any:
        return {}

    def close(self) -> None:
        pass


class VirtualTimeLoop(asyncio.BaseEventLoop):
    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__()
        self._now_s = start_s
        self._selector = _NoSelector(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now_s

    def advance_to_next_timer(self) -> None:
        """Jump to the earliest timer that is not cancelled (the loop pops cancelled ones first)."""
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if scheduled:
            self._now_s = max(self._now_s, scheduled[0].when())

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # one thread: nothing to wake

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:  # type: ignore[override]
        return self.call_soon(callback, *args, context=context)


def run(main: Coroutine[Any, Any, T], *, start_s: float = 0.0) -> T:
    """``asyncio.run`` on a fresh virtual-time loop."""
    loop = VirtualTimeLoop(start_s)
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(main)
