"""efo.gc_tuning: the collector as ``efo run`` sets it, and put back by ``tuned`` (benchmarks)."""

from __future__ import annotations

import gc
import weakref

from efo import gc_tuning


def test_tuned_raises_the_young_threshold_freezes_start_up_and_puts_both_back() -> None:
    before_threshold = gc.get_threshold()
    before_frozen = gc.get_freeze_count()
    with gc_tuning.tuned():
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, *before_threshold[1:])
        assert gc.get_freeze_count() > before_frozen
        survivor = [[]]  # made after tune(): collected as usual, not frozen
        assert gc.is_tracked(survivor)
        assert gc.collect() >= 0 and survivor == [[]]
    assert gc.get_threshold() == before_threshold
    assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_cycles_made_after_tuning_are_still_collected() -> None:
    with gc_tuning.tuned():
        node = _Node()
        gone = weakref.ref(node)
        del node
        assert gone() is not None  # a cycle: reference counting alone does not free it
        gc.collect(0)
        assert gone() is None
