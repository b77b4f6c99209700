"""The cyclic garbage collector, set for a process that decodes records all day (``efo run``).

Decoding one SubscribeToShardEvent made a dict per record (orjson; events of records over 1,350 B
still do), and the records' lists live on in the pending pool until their batch commits. With
CPython's default thresholds (700, 10, 10) the young generation is collected every few events,
each time in the middle of a decode with that event's dicts alive, which promotes them, so the
older generations are collected often too, the oldest over every module, botocore model and Spark
object loaded at start. Measured with ``bench/ingest.py`` at 64 shards x 1 KiB (gc.callbacks
around every collection, before msgspec): 67-80 us of collection per event of 100 records, about
11 % of the process's CPU; with :func:`tune` 2-3 us.

:func:`tune` collects once, freezes what start-up left (``gc.freeze``: collections no longer walk
it; a frozen object that later becomes cyclic garbage is never freed, and what start-up makes lives
as long as the process) and collects the young generation only once 10,000 more containers are
alive than were, instead of 700. Records freed as usual (by reference counting) do not count
towards that; cyclic garbage waits for up to 10,000 containers before a young collection. The
driver also collects the young and middle generations after each batch, and all of them every
11th (sparkbridge.driver.Driver.commit): py4j's proxies of a batch's Spark objects are cycles that
hold the batch in the JVM until they are collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Containers allocated (net of those freed) before the young generation is collected; CPython's default is 700.
YOUNG_THRESHOLD = 10_000


def tune(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Set the collector for the rest of the process: after start-up, before records flow."""
    gc.collect()
    gc.freeze()
    gc.collect()  # so that full collections are started by what was made since, not by start-up's size
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, oldest)


@contextmanager
def tuned(young_threshold: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """:func:`tune` for a while (benchmarks run efo's code, tuned as ``efo run`` is, beside others'
    code). The thresholds are put back; what was frozen is unfrozen only if nothing was before."""
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    tune(young_threshold)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not frozen_before:
            gc.unfreeze()
