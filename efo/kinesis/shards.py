"""Shard discovery: ListShards, every page, into a :class:`~efo.kinesis.graph.ShardGraph`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from efo.errors import translate
from efo.kinesis.graph import Shard, ShardGraph


async def list_shards(
    kinesis: Any, stream_arn: str, parse: Callable[[dict[str, Any]], Shard] = Shard.from_api
) -> ShardGraph:
    """Every shard of the stream, each listed one parsed by ``parse``."""
    shards: list[Shard] = []
    args: dict[str, Any] = {"StreamARN": stream_arn}
    try:
        while True:
            page = await kinesis.list_shards(**args)
            shards.extend(parse(item) for item in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                break
            args = {"NextToken": token}
    except Exception as exc:
        raise translate(exc, resource=f"shards of stream {stream_arn}") from None
    return ShardGraph.of(shards)
