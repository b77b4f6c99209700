"""What changed between reads of the lease table (efo.leases.changes), found partition by partition,
against comparing every lease; and the view and the readable index fed partitions as the cache
feeds them, against the same fed none."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

from efo.leases.changes import Change, LeaseChanges
from efo.leases.model import Lease, PendingReset
from efo.leases.readable import ReadableLeases
from efo.leases.view import TableView
from efo.pipeline.records import Position
from efo.sim.clock import ManualClock

WORKERS = [None, "me", "a", "b"]
PARTITIONS = 4


def _lease(rng: random.Random, index: int) -> Lease:
    parents = (f"s{index - 1}",) if index and rng.random() < 0.3 else ()
    return Lease(f"s{index}", parents, rng.choice(WORKERS), 1, Position("TRIM_HORIZON"))


class Cache:
    """The lease cache as the consumers see it: each partition read again or kept as the very
    mapping of the last read; a shard may move to another partition (the table grew)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.parts: dict[int, dict[str, Lease]] = {p: {} for p in range(PARTITIONS)}
        for index in range(rng.randrange(1, 30)):
            self.parts[rng.randrange(PARTITIONS)][f"s{index}"] = _lease(rng, index)

    def read(self) -> tuple[dict[str, Lease], dict[int, Mapping[str, Lease]]]:
        rng = self.rng
        for partition in range(PARTITIONS):
            if rng.random() < 0.4:
                continue  # not read again: the same mapping
            part = dict(self.parts[partition])
            for shard_id in sorted(part):
                match rng.randrange(9):
                    case 0:
                        del part[shard_id]
                    case 1:
                        part[shard_id] = replace(part[shard_id], owner=rng.choice(WORKERS), counter=2)
                    case 2:
                        part[shard_id] = replace(part[shard_id])  # read again: an equal row, a new object
                    case 3:
                        part[shard_id] = replace(part[shard_id], checkpoint=Position("AT_SEQUENCE_NUMBER", "9"))
                    case 4:
                        asked = rng.choice([None, "a", "b"])
                        reset = PendingReset("r1", Position("TRIM_HORIZON")) if rng.random() < 0.3 else None
                        part[shard_id] = replace(part[shard_id], wanted_by=asked, reset=reset)
                    case 5 if partition + 1 < PARTITIONS:  # moved on to the next partition
                        moved = part.pop(shard_id)
                        self.parts[partition + 1] = {**self.parts[partition + 1], shard_id: moved}
            for _ in range(rng.randrange(2)):
                index = rng.randrange(40)
                if not any(f"s{index}" in other for other in self.parts.values()):
                    part[f"s{index}"] = _lease(rng, index)
            self.parts[partition] = part
        leases = {shard_id: lease for part in self.parts.values() for shard_id, lease in part.items()}
        return leases, dict(self.parts)


def _by_comparing_all(last: Mapping[str, Lease], leases: Mapping[str, Lease]) -> set[Change]:
    changed = {(sid, last.get(sid), lease) for sid, lease in leases.items() if last.get(sid) is not lease}
    return changed | {(sid, lease, None) for sid, lease in last.items() if sid not in leases}


def test_partition_by_partition_it_finds_what_comparing_every_lease_finds() -> None:
    """Over random reads (partitions kept or read again, rows changed, read again as equal objects,
    deleted, added, moved to another partition; now and then a read without partitions, as after
    the cycle put its own write into it), the changes equal those of comparing every lease."""
    for seed in range(300):
        rng = random.Random(seed)
        cache, changes = Cache(rng), LeaseChanges()
        last: dict[str, Lease] = {}
        for step in range(40):
            leases, parts = cache.read()
            if rng.random() < 0.1:
                parts = {}  # unknown: every lease is compared
            found = changes.update(leases, parts)
            assert len(found) == len(set(found)), (seed, step)
            assert set(found) == _by_comparing_all(last, leases), (seed, step)
            assert all(changes.get(sid) is lease for sid, lease in leases.items()), (seed, step)
            last = leases


def test_the_view_and_the_readable_index_fed_partitions_know_what_they_know_fed_none() -> None:
    """The lease cycle hands its reads' partitions on; each part keeps what it would without them."""
    for seed in range(150):
        rng = random.Random(seed)
        cache, clock = Cache(rng), ManualClock()
        views = [TableView("me", failover_s=10.0, clock=clock) for _ in range(2)]
        indexes = [ReadableLeases(), ReadableLeases()]
        for step in range(40):
            clock.t = float(step)
            leases, parts = cache.read()
            views[0].saw_leases(leases, answered_at=clock.t, parts=parts)
            views[1].saw_leases(leases, answered_at=clock.t)
            indexes[0].update(leases, parts)
            indexes[1].update(leases)
            for window in (3.0, 1000.0):
                assert views[0].moved_within(window) == views[1].moved_within(window), (seed, step)
            assert views[0].reserved_for_others() == views[1].reserved_for_others(), (seed, step)
            assert views[0].resets == views[1].resets, (seed, step)
            assert indexes[0].by_owner == indexes[1].by_owner, (seed, step)
