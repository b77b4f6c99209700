"""bench/spark_source.py: the window a run measures holds the batches it counts."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from spark_source import next_window  # noqa: E402


def inside(window: tuple[float, float], ends: list[float]) -> list[float]:
    return [t for t in ends if window[0] <= t <= window[1]]


def test_a_window_closes_only_with_two_batch_ends_inside_it_growing_until_then() -> None:
    """A 3 s window (2-5 s) that slow batches outlast: one ended in it (4.0 s), the next after it
    (5.3 s). Closing it then counted both and measured one (the run failed: fewer than two batches
    ended in the window); it must grow to take the second in."""
    window, done = next_window((2.0, 5.0), [4.0, 5.3], now=6.1)
    assert not done and window == (2.0, 6.1)
    window, done = next_window(window, [4.0, 5.3], now=7.2)
    assert done and inside(window, [4.0, 5.3]) == [4.0, 5.3]


def test_a_window_is_not_closed_before_a_second_of_slack_past_its_end() -> None:
    window, done = next_window((2.0, 5.0), [2.5, 3.0, 4.0], now=5.5)
    assert not done and window == (2.0, 5.0), "a batch that ended by its end may not be reported yet"
    window, done = next_window((2.0, 5.0), [2.5, 3.0, 4.0], now=6.1)
    assert done and window == (2.0, 5.0)
