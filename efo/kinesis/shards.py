"""Shard discovery and the parent/child graph.

A shard is closed when another shard names it as a parent. (Its EndingSequenceNumber would say
so too on AWS, but emulators report it wrongly, and parentage is what ordering needs anyway.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from efo.errors import translate


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


async def list_shards(kinesis: Any, stream_arn: str) -> ShardGraph:
    shards: list[Shard] = []
    args: dict[str, Any] = {"StreamARN": stream_arn}
    try:
        while True:
            page = await kinesis.list_shards(**args)
            shards.extend(Shard.from_api(item) for item in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                break
            args = {"NextToken": token}
    except Exception as exc:
        raise translate(exc, resource=f"shards of stream {stream_arn}") from None
    return ShardGraph.of(shards)
