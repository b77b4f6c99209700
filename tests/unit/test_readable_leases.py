"""The readable leases by owner, kept from read to read, against working them out from every lease."""

from __future__ import annotations

import random
from dataclasses import replace

from efo.leases import balance
from efo.leases.model import Lease
from efo.leases.readable import ReadableLeases, can_read
from efo.pipeline.records import Position

WORKERS = [None, "a", "b", "c"]
START = Position("TRIM_HORIZON")
END = Position("SHARD_END")


def _lease(rng: random.Random, index: int) -> Lease:
    parents = tuple(f"s{p}" for p in sorted(rng.sample(range(index), k=min(index, rng.randrange(3)))))
    return Lease(f"s{index}", parents, rng.choice(WORKERS), 1, rng.choice([START, START, END]))


def _next_read(rng: random.Random, leases: dict[str, Lease]) -> dict[str, Lease]:
    """Some leases moved, finished, reset to unfinished, asked for, read again as new objects,
    deleted; a few new ones (whose parents may have no lease)."""
    after = dict(leases)
    for shard_id in rng.sample(sorted(after), k=min(len(after), rng.randrange(5))):
        lease = after[shard_id]
        match rng.randrange(6):
            case 0:
                after[shard_id] = replace(lease, owner=rng.choice(WORKERS), counter=lease.counter + 1)
            case 1:
                after[shard_id] = replace(lease, checkpoint=END)
            case 2:
                after[shard_id] = replace(lease, checkpoint=START)
            case 3:
                after[shard_id] = replace(lease)
            case 4:
                del after[shard_id]
            case _:
                after[shard_id] = replace(lease, wanted_by=rng.choice(WORKERS))
    for _ in range(rng.randrange(3)):
        index = rng.randrange(30)
        after.setdefault(f"s{index}", _lease(rng, index))
    return after


def _full(leases: dict[str, Lease]) -> dict[str | None, dict[str, Lease]]:
    return balance.by_owner(lease for lease in leases.values() if can_read(lease, leases))


def test_kept_from_read_to_read_it_equals_working_it_out_from_every_lease() -> None:
    """Over random sequences of reads (a parent finishing makes its children readable, one reset to
    unfinished makes them wait again, a parent's lease deleted or created, leases moving, the caller
    changing its map after the update), the index equals the full recomputation after every read."""
    for seed in range(200):
        rng = random.Random(seed)
        leases = {f"s{i}": _lease(rng, i) for i in range(rng.randrange(1, 25))}
        index = ReadableLeases()
        for step in range(50):
            leases = _next_read(rng, leases)
            index.update(leases)
            expected = _full(leases)
            assert {owner: dict(group) for owner, group in index.by_owner.items()} == expected, (seed, step)
            assert index.count == sum(len(group) for group in expected.values())
            for shard_id, lease in leases.items():
                assert (index.get(shard_id) is lease) == can_read(lease, leases), (seed, step, shard_id)
            if rng.random() < 0.2 and leases:  # the caller changes its own map afterwards
                shard_id = rng.choice(sorted(leases))
                leases[shard_id] = replace(leases[shard_id], checkpoint=END)


def test_built_at_once_it_equals_working_it_out_from_every_lease() -> None:
    rng = random.Random(7)
    leases = {f"s{i}": _lease(rng, i) for i in range(40)}
    assert {owner: dict(group) for owner, group in ReadableLeases.of(leases).by_owner.items()} == _full(leases)


def test_a_plan_does_not_depend_on_the_order_of_the_leases() -> None:
    """The cycle plans from the index (grouped by owner, in no order), the tests of balance from sorted lists."""
    rng = random.Random(3)
    workers = ["a", "b", "c", "d"]
    for _ in range(300):
        leases = [
            Lease(f"s{i:03d}", (), rng.choice([None, "x", *workers]), 1, START, wanted_by=rng.choice([None, "a", "b"]))
            for i in range(rng.randrange(1, 40))
        ]
        live = rng.sample(workers, k=rng.randrange(1, 5))
        kwargs = {
            "moved_recently": {lease.shard_id for lease in leases if rng.random() < 0.2},
            "reserved_for_others": {lease.shard_id for lease in leases if rng.random() < 0.2},
            "stale_free": {lease.shard_id for lease in leases if rng.random() < 0.2},
            "may_ask": rng.random() < 0.8,
        }
        me = rng.choice(workers)
        shuffled = rng.sample(leases, k=len(leases))
        assert balance.plan(me, leases, live, **kwargs) == balance.plan_by_owner(  # type: ignore[arg-type]
            me,
            balance.by_owner(shuffled),
            live,
            **kwargs,  # type: ignore[arg-type]
        )
