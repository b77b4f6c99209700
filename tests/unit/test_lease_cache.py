"""The lease cache alone, with a fake table and a fake clock: every read takes the version row and
the versions, and a lease partition only when its leases may have changed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection, Mapping
from typing import Any

import pytest

from efo.errors import Retriable
from efo.leases.cache import LeaseCache
from efo.leases.model import Lease, TableState, lease_partition_of
from efo.leases.readable import ReadableLeases
from efo.leases.view import TableView
from efo.pipeline.records import Position
from efo.sim.clock import ManualClock


class FakeTable:
    """Two lease partitions, one lease: shard-1, in partition HOME."""

    worker_id = "me"
    lease_partitions = 2

    def __init__(self) -> None:
        self.versions = {0: 0, 1: 0}
        self.changed: set[int] = set()
        self.partitions_read: list[int] = []
        self.control_reads = 0
        self.owner: str | None = None
        self.consistent: list[bool] = []  # of each read_leases
        #: Eventually consistent reads answer from before the last change (its owner, its mark) this many times.
        self.lagging = 0
        self.owner_before: str | None = None

    async def layout(self) -> int:
        return self.lease_partitions

    def partition_of(self, shard_id: str) -> int:
        return lease_partition_of(shard_id, self.lease_partitions)

    def take_changed(self) -> set[int]:
        changed, self.changed = self.changed, set()
        return changed

    async def read_version(self, *, consistent: bool = True) -> TableState:
        assert consistent, "a version read a second late would miss a change at the next cycle"
        self.control_reads += 1
        return TableState(versions=dict(self.versions), members=self.control_reads)

    async def read_leases(self, partitions: Collection[int], *, consistent: bool = True) -> TableState:
        self.partitions_read += sorted(partitions)
        self.consistent.append(consistent)
        behind = not consistent and self.lagging > 0
        self.lagging -= behind
        owner = self.owner_before if behind else self.owner
        leases = {"shard-1": Lease("shard-1", (), owner, 1, Position("TRIM_HORIZON"))}
        marks = {p: self.versions[p] - (behind and p == HOME) for p in partitions}  # as of the answer
        parts: dict[int, Mapping[str, Lease]] = {p: leases if p == HOME else {} for p in partitions}
        return TableState(leases=leases if HOME in partitions else {}, versions=marks, parts=parts)

    @property
    def lease_reads(self) -> int:
        return len(self.partitions_read)


HOME = lease_partition_of("shard-1", 2)
OTHER = 1 - HOME


class Clock(ManualClock):
    def __init__(self) -> None:
        super().__init__(100.0)


def _cache(table: FakeTable, clock: Clock) -> LeaseCache:
    return LeaseCache(table, full_read_interval_s=30.0, clock=clock, rng=lambda: 1.0)  # type: ignore[arg-type]


def _read(cache: LeaseCache) -> TableState:
    return asyncio.run(cache.read())


def test_the_lease_partitions_are_read_once_and_then_only_the_version_row() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    for _ in range(20):
        state = _read(cache)
        clock.t += 1.0
    assert table.control_reads == 20 and table.partitions_read == [0, 1]
    assert set(state.leases) == {"shard-1"} and state.members == 20  # the membership counter is fresh


def test_a_moved_version_reads_that_lease_partition_again_and_an_older_answer_does_not() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    table.versions[HOME], table.owner = 3, "other"
    assert _read(cache).leases["shard-1"].owner == "other"
    assert table.partitions_read == [0, 1, HOME], "only the partition whose version moved"
    table.versions[HOME] = 2  # an eventually consistent answer older than one already seen
    _read(cache)
    table.versions[HOME] = 3
    _read(cache)
    assert table.partitions_read == [0, 1, HOME]


def test_another_worker_s_change_is_read_eventually_consistent_and_an_answer_from_before_it_again() -> None:
    """Every worker reads a partition whose version moved: at half the price, with its mark to tell an
    answer from before the change; such an answer is not used, and the partition is read again
    eventually consistent, then strongly."""
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    table.versions[HOME], table.owner = 1, "other"
    assert _read(cache).leases["shard-1"].owner == "other"
    assert table.consistent == [False, False]
    table.versions[HOME], table.owner, table.owner_before, table.lagging = 2, None, "other", 1
    assert _read(cache).leases["shard-1"].owner == "other", "as read before: the answer was older than that"
    assert _read(cache).leases["shard-1"].owner is None
    assert table.consistent == [False, False, False, False]
    _read(cache)
    assert table.partitions_read == [0, 1, HOME, HOME, HOME], "read until its mark caught up, and no more"
    table.versions[HOME], table.owner, table.owner_before, table.lagging = 3, "third", None, 5
    assert _read(cache).leases["shard-1"].owner is None
    assert _read(cache).leases["shard-1"].owner is None
    assert _read(cache).leases["shard-1"].owner == "third"
    assert table.consistent[-3:] == [False, False, True], "twice behind: then strongly"


def test_a_change_of_this_worker_reads_that_lease_partition_again() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    table.changed.add(OTHER)  # a claim, a release, or a conditional write that found a lease moved on
    _read(cache)
    _read(cache)
    assert table.partitions_read == [0, 1, OTHER]
    assert "shard-1" in _read(cache).leases, "a partition read again keeps the others' leases"


def test_the_lease_rows_are_read_at_least_every_full_read_interval() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    clock.t += 29.9
    _read(cache)
    assert table.lease_reads == 2
    clock.t += 0.1
    _read(cache)
    assert table.lease_reads == 4
    assert table.consistent == [False, False], "the first read and the safety net eventually consistent"


def test_the_first_read_is_eventually_consistent_and_a_partition_behind_its_version_is_read_strongly_at_once() -> None:
    """A worker that starts has nothing read before to keep: an answer from before a change (its
    mark below the version) is read again strongly in the same read, not left out."""
    table, clock = FakeTable(), Clock()
    table.versions[HOME], table.owner, table.lagging = 4, "other", 1
    cache = _cache(table, clock)
    assert _read(cache).leases["shard-1"].owner == "other"
    assert table.partitions_read == [0, 1, HOME] and table.consistent == [False, True]


def test_the_safety_net_comes_at_a_random_moment_of_the_interval_s_second_half() -> None:
    table, clock = FakeTable(), Clock()
    cache = LeaseCache(table, full_read_interval_s=30.0, clock=clock, rng=lambda: 0.0)  # type: ignore[arg-type]
    _read(cache)
    clock.t += 14.9
    _read(cache)
    assert table.lease_reads == 2
    clock.t += 0.1
    _read(cache)
    assert table.lease_reads == 4


def test_the_safety_net_leaves_out_a_partition_read_strongly_moments_ago() -> None:
    """An eventually consistent answer could be older than that read: it would undo a change there."""
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    clock.t += 25.0
    table.changed.add(HOME)
    _read(cache)  # HOME, strongly
    clock.t += 5.0
    _read(cache)  # the safety net: OTHER only
    assert table.partitions_read == [0, 1, HOME, OTHER] and table.consistent == [False, True, False]


def test_a_failed_read_of_a_changed_partition_is_read_again_next_time() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    _read(cache)
    table.changed.add(HOME)  # this worker claimed shard-1
    table.owner = "me"
    real = table.read_leases

    async def throttled(partitions: Collection[int], *, consistent: bool = True) -> TableState:
        raise Retriable("ProvisionedThroughputExceededException")

    table.read_leases = throttled  # type: ignore[method-assign]
    with pytest.raises(Retriable):
        _read(cache)
    table.read_leases = real  # type: ignore[method-assign]
    assert _read(cache).leases["shard-1"].owner == "me", "the claim's partition was forgotten"


def test_a_read_is_a_copy_so_a_cycle_changing_it_leaves_the_cache_as_it_was() -> None:
    table, clock = FakeTable(), Clock()
    cache = _cache(table, clock)
    first: Any = _read(cache)
    del first.leases["shard-1"]
    assert "shard-1" in _read(cache).leases and table.lease_reads == 2


class RowsTable:
    """Partitions of rows set by the test, changed by this worker (read again strongly) or by
    another (its version moved: read eventually consistent), every answer up to date but the first
    eventually consistent one of partition ``behind_once`` (read again strongly at once, last). A
    shard may sit in two partitions at once (its finished lease deleted, written again in a newer
    generation, while an older answer of the first is kept)."""

    worker_id = "me"

    def __init__(self, partitions: int) -> None:
        self.rows: dict[int, dict[str, Lease]] = {p: {} for p in range(partitions)}
        self.versions = dict.fromkeys(self.rows, 1)
        self.changed: set[int] = set()
        self.behind_once = 0

    async def layout(self) -> int:
        return len(self.rows)

    def partition_of(self, shard_id: str) -> int:
        return 0

    def take_changed(self) -> set[int]:
        changed, self.changed = self.changed, set()
        return changed

    async def read_version(self, *, consistent: bool = True) -> TableState:
        return TableState(versions=dict(self.versions))

    async def read_leases(self, partitions: Collection[int], *, consistent: bool = True) -> TableState:
        state = TableState(versions={p: self.versions[p] for p in partitions})
        if not consistent and self.behind_once in partitions:
            state.versions[self.behind_once] -= 1
            self.behind_once = -1
        for partition in sorted(partitions):
            state.parts[partition] = dict(self.rows[partition])
            state.leases.update(state.parts[partition])
        return state


def test_a_shard_in_two_partitions_reads_as_the_partitions_merged_in_order_and_fails_no_part() -> None:
    """Whatever the partitions hold, each read's leases are those of every partition as last read,
    merged in partition order (the later partition's copy of a shard in two, whatever order they
    were first read in); the view and the readable index fed each read never fail, and the index
    equals one built from that read's leases. (A shard that left the partition its merged copy came
    from, while another still held it, once made each later cycle fail with a KeyError.)"""
    for seed in range(300):
        rng = random.Random(seed)
        table, clock = RowsTable(3), ManualClock(100.0)
        table.behind_once = rng.randrange(3)
        cache = LeaseCache(table, full_read_interval_s=3600.0, clock=clock, rng=lambda: 1.0)  # type: ignore[arg-type]
        view, index = TableView("me", 10.0, clock=clock), ReadableLeases()
        known: dict[int, dict[str, Lease]] = {}  # each partition's rows as the cache last read them
        for step in range(30):
            for partition in sorted(table.rows):
                if step and rng.random() < 0.5:
                    continue
                rows = table.rows[partition] = dict(table.rows[partition])
                for shard_id in sorted(rows):
                    if rng.random() < 0.3:
                        del rows[shard_id]
                for _ in range(rng.randrange(3)):
                    shard_id = f"s{rng.randrange(6)}"
                    rows[shard_id] = Lease(shard_id, (), rng.choice([None, "me", "a"]), step, Position("LATEST"))
                if step and rng.random() < 0.5:
                    table.changed.add(partition)  # by this worker
                else:
                    table.versions[partition] += 1  # by another
                known[partition] = dict(rows)
            state = asyncio.run(cache.read())
            expected: dict[str, Lease] = {}
            for partition in sorted(known):
                expected.update(known[partition])
            assert state.leases == expected, (seed, step)
            view.saw_leases(state.leases, answered_at=clock.now(), parts=state.parts)
            index.update(state.leases, state.parts)
            assert index.by_owner == ReadableLeases.of(state.leases).by_owner, (seed, step)
            clock.t += 1.0
