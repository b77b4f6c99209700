"""efo.gc_tuning: the collector as ``efo run`` sets it, and put back by ``tuned`` (benchmarks)."""

from __future__ import annotations

import gc
from typing import Any

from efo import gc_tuning


def test_tuned_raises_the_young_threshold_freezes_start_up_and_puts_both_back() -> None:
    before_threshold = gc.get_threshold()
    before_frozen = gc.get_freeze_count()
    start_up = [[]]  # made before: frozen, so no collection walks it
    with gc_tuning.tuned():
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, *before_threshold[1:])
        assert gc.get_freeze_count() > before_frozen
        assert not any(obj is start_up for obj in gc.get_objects())
        later = [[]]  # made after: collected as usual
        gc.collect()
        assert any(obj is later for obj in gc.get_objects(2))
    assert gc.get_threshold() == before_threshold
    assert gc.get_freeze_count() == before_frozen


def test_tuned_leaves_frozen_what_was_frozen_before_it() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_tuning.tuned():
            pass
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_cycles_made_after_tuning_are_collected_without_asking_once_the_young_threshold_is_passed() -> None:
    collected: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 0:
            collected.append(info["collected"])

    gc.callbacks.append(count)
    try:
        with gc_tuning.tuned():
            for _ in range(2 * gc_tuning.YOUNG_THRESHOLD):
                _Node()  # a cycle: reference counting alone does not free it
    finally:
        gc.callbacks.remove(count)
    assert sum(collected) > 0
    # Two containers a node (it and its __dict__): about 4 young collections, where CPython's
    # threshold of 700 makes about 57.
    assert len(collected) <= 10
