"""The cyclic garbage collector, set for a process that decodes records all day (``efo run``).

Decoding one SubscribeToShardEvent makes a dict per record (orjson), and the records' lists live on
in the pending pool until their batch commits. With CPython's default thresholds (700, 10, 10) the
young generation is collected every few events, each time in the middle of a decode with that
event's dicts alive, which promotes them, so the older generations are collected often too, the
oldest over every module, botocore model and Spark object loaded at start. Measured with
``bench/ingest.py`` at 64 shards x 1 KiB (gc.callbacks around every collection): 67-80 us of
collection per event of 100 records, 12-15 % of the process's CPU; with :func:`tune` 2-3 us.

:func:`tune` collects once, freezes what start-up left (``gc.freeze``: the oldest generation's
collections no longer walk it; it lives as long as the process anyway) and collects the young
generation only once 10,000 more containers are alive than were, instead of 700. Records freed as
usual (by reference counting) do not count towards that, so collections become rare without
garbage cycles waiting longer than a few thousand containers' worth.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Containers allocated (net of those freed) before the young generation is collected; CPython's default is 700.
YOUNG_THRESHOLD = 10_000


def tune() -> None:
    """Set the collector for the rest of the process: after start-up, before records flow."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


@contextmanager
def tuned() -> Iterator[None]:
    """:func:`tune` for a while (benchmarks compare efo's code, tuned as ``efo run`` is, with others' code)."""
    before = gc.get_threshold()
    tune()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
