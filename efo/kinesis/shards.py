"""Shard discovery: ListShards, every page, into a :class:`~efo.kinesis.graph.ShardGraph`."""

from __future__ import annotations

from typing import Any

from efo.errors import translate
from efo.kinesis.graph import Shard, ShardGraph


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
