"""Shards and the parent/child graph of a stream, as a listing shows them (no AWS client here).

A shard is closed when another shard names it as a parent. (Its EndingSequenceNumber would say
so too on AWS, but emulators report it wrongly, and parentage is what ordering needs anyway.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Shard:
    shard_id: str
    parents: tuple[str, ...]
    starting_hash_key: int
    ending_hash_key: int

    @classmethod
    def from_api(cls, item: dict[str, Any]) -> Shard:
        parents = tuple(p for p in (item.get("ParentShardId"), item.get("AdjacentParentShardId")) if p)
        hash_range = item.get("HashKeyRange") or {}
        return cls(
            shard_id=item["ShardId"],
            parents=parents,
            starting_hash_key=int(hash_range.get("StartingHashKey", 0)),
            ending_hash_key=int(hash_range.get("EndingHashKey", 0)),
        )


@dataclass(frozen=True, slots=True)
class ShardGraph:
    shards: dict[str, Shard]

    @classmethod
    def of(cls, shards: Iterable[Shard]) -> ShardGraph:
        return cls({s.shard_id: s for s in shards})

    def children(self, shard_id: str) -> list[str]:
        return sorted(s.shard_id for s in self.shards.values() if shard_id in s.parents)

    def is_closed(self, shard_id: str) -> bool:
        return any(shard_id in s.parents for s in self.shards.values())

    def ancestors(self, shard_ids: Iterable[str]) -> set[str]:
        """Every shard of this listing that one of ``shard_ids`` descends from."""
        found: set[str] = set()
        todo = [parent for shard_id in shard_ids if shard_id in self.shards for parent in self.shards[shard_id].parents]
        while todo:
            shard_id = todo.pop()
            if shard_id not in found:
                found.add(shard_id)
                if shard_id in self.shards:
                    todo.extend(self.shards[shard_id].parents)
        return found

    def needing_leases(self, leased: Collection[str]) -> list[str]:
        """The shards of this listing that should have a lease and have none, parents before children.
        One without a lease that a shard with a lease descends from was finished, and its lease deleted
        (:mod:`efo.leases.cleanup` deletes a lineage from its oldest shard down): it must not be read
        again. So a lineage's leases must be written in this order: a child's written before its
        parent's (a writer that died in between) would hide the parent for ever."""
        covered = self.ancestors(leased)
        return self.parents_first({s for s in self.shards if s not in leased and s not in covered})

    def parents_first(self, shard_ids: Collection[str]) -> list[str]:
        """``shard_ids`` in an order where each comes after those of its parents among them (and by
        name otherwise), the order in which a lineage's leases must be written."""
        among = set(shard_ids)
        parents = {s: self.shards[s].parents if s in self.shards else () for s in among}
        ordered: list[str] = []
        placed: set[str] = set()
        waiting = sorted(among)
        while waiting:  # a generation at a time: those whose parents among them are placed
            ready = [s for s in waiting if not any(p in among and p not in placed for p in parents[s])]
            ready = ready or waiting  # nothing ready: a cycle, which no listing has
            ordered += ready
            placed.update(ready)
            waiting = [s for s in waiting if s not in placed]
        return ordered
