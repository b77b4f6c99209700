"""The shards of each stream as the conformance proxy last listed them, shared by its subscriptions.

The proxy learns that a shard closed (and its children) from ListShards. Asked by every subscription
after each empty event, that was one listing per subscription and second, all pages of it: with
256 subscriptions kinesis-local spent a whole core answering them, and opening the subscriptions
took up to 52 s instead of 5. Here a stream is listed at most once per ``max_age_s``, with one listing in flight at a
time whose result every caller waiting for it shares.

A listing that shows a shard closed stays true; one that does not is at most ``max_age_s`` old, so
a closure is noticed that much later, never before it happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("efo.devstack.listings")

Shard = dict[str, Any]
# Listings nobody asked for in this long are dropped.
FORGET_AFTER_S = 60.0


@dataclass(frozen=True)
class StreamKey:
    """A stream as kinesis-local tells them apart: account (from the access key id), region, ARN."""

    access_key: str
    region: str
    stream_arn: str


@dataclass(frozen=True)
class _Listing:
    requested_at: float  # monotonic time the listing was asked for: it is at least this recent
    shards: list[Shard]


class ShardListings:
    """``shards(key)``: the stream's shards, listed at most ``max_age_s`` ago; ``close()`` is idempotent."""

    def __init__(self, fetch: Callable[[StreamKey], Awaitable[list[Shard]]], max_age_s: float) -> None:
        self._fetch = fetch
        self.max_age_s = max_age_s
        self._listed: dict[StreamKey, _Listing] = {}
        self._pending: dict[StreamKey, asyncio.Task[list[Shard]]] = {}

    async def shards(self, key: StreamKey) -> list[Shard]:
        """Raises what the listing failed with, for every caller that waited for it."""
        now = time.monotonic()
        listing = self._listed.get(key)
        if listing is not None and now - listing.requested_at < self.max_age_s:
            return listing.shards
        task = self._pending.get(key)
        if task is None:
            self._forget_older_than(now - FORGET_AFTER_S)
            task = asyncio.create_task(self._list(key, now))
            task.add_done_callback(_retrieve)
            self._pending[key] = task
        # A caller that goes away (its client disconnected) leaves the listing to the others.
        return await asyncio.shield(task)

    async def children(self, key: StreamKey, shard_id: str) -> list[Shard]:
        """The ChildShards entries of a shard, empty while it is open."""
        return [
            {
                "ShardId": shard["ShardId"],
                "ParentShards": [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p],
                "HashKeyRange": shard["HashKeyRange"],
            }
            for shard in await self.shards(key)
            if shard_id in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId"))
        ]

    async def close(self) -> None:
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._pending.clear()

    async def _list(self, key: StreamKey, requested_at: float) -> list[Shard]:
        try:
            shards = await self._fetch(key)
        except Exception as exc:
            log.warning("listing.failed stream=%s error=%s", key.stream_arn, str(exc) or type(exc).__name__)
            raise
        finally:
            del self._pending[key]
        self._listed[key] = _Listing(requested_at, shards)
        return shards

    def _forget_older_than(self, cutoff: float) -> None:
        self._listed = {k: v for k, v in self._listed.items() if v.requested_at >= cutoff}


def _retrieve(task: asyncio.Task[list[Shard]]) -> None:
    """Mark a failed listing's exception as seen even when every caller went away before it ended."""
    if not task.cancelled():
        task.exception()
