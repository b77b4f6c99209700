"""What the operator views compute from one read of the lease table and the shard list: who is
alive, what state each lease is in, and the shard tree in reading order. Pure functions, no I/O.

Liveness here is judged on the operator's clock from a single read: a worker is live while its
heartbeat row was written less than ``failover_s`` ago. (The workers themselves judge each other by
whether the heartbeat counter changed, on their own clocks; a skewed clock on either side shifts
this view by the skew.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from efo.kinesis.graph import ShardGraph
from efo.leases.model import Lease, TableState, WorkerRow

HASH_KEY_SPACE = 2**128

#: The states of a shard's lease, as ``efo shards`` and ``efo checkpoints show`` print them.
LEASE_STATES = {
    "reading": "a live worker holds the lease",
    "owner-dead": "the owner's heartbeat is older than lease.failover_s: another worker takes it over",
    "free": "no owner: the next worker with room claims it",
    "finished": "the sink committed the shard's last record (SHARD_END)",
    "no-lease": "no worker has written a lease for it yet (a new child shard, or the application never ran)",
}

#: How a terminal colours them.
LEASE_STYLES = {"reading": "green", "owner-dead": "red", "free": "yellow", "no-lease": "yellow"}


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    worker_id: str
    live: bool
    heartbeat_age_s: float | None  # None: no heartbeat row (an owner that never wrote one, or removed it)
    row: WorkerRow | None


def heartbeat_age_s(row: WorkerRow, now: datetime) -> float | None:
    return None if row.updated_at is None else max(0.0, (now - row.updated_at).total_seconds())


def is_live(row: WorkerRow, now: datetime, failover_s: float) -> bool:
    age = heartbeat_age_s(row, now)
    return age is not None and age < failover_s


def worker_statuses(state: TableState, now: datetime, failover_s: float) -> dict[str, WorkerStatus]:
    """Every worker with a heartbeat row, and every lease owner without one (never live)."""
    statuses = {
        worker_id: WorkerStatus(worker_id, is_live(row, now, failover_s), heartbeat_age_s(row, now), row)
        for worker_id, row in state.workers.items()
    }
    for lease in state.leases.values():
        if lease.owner and lease.owner not in statuses:
            statuses[lease.owner] = WorkerStatus(lease.owner, False, None, None)
    return statuses


def lease_state(lease: Lease | None, live_workers: set[str]) -> str:
    """One of :data:`LEASE_STATES`."""
    if lease is None:
        return "no-lease"
    if lease.finished:
        return "finished"
    if lease.owner is None:
        return "free"
    return "reading" if lease.owner in live_workers else "owner-dead"


def tree_order(graph: ShardGraph, extra: Iterable[str] = ()) -> list[tuple[str, int]]:
    """Every shard as ``(shard_id, depth)``, parents before children: each root (a shard none of
    whose parents is listed) in id order, each child right after the last of its parents, one level
    deeper than the deepest of them. ``extra`` shards (leases of shards past retention) come last,
    at depth 0."""
    known = set(graph.shards)
    depth: dict[str, int] = {}
    order: list[tuple[str, int]] = []

    def visit(shard_id: str) -> None:
        parents = [p for p in graph.shards[shard_id].parents if p in known]
        if shard_id in depth or any(p not in depth for p in parents):
            return  # already placed, or it waits for its other parent
        depth[shard_id] = 1 + max((depth[p] for p in parents), default=-1)
        order.append((shard_id, depth[shard_id]))
        for child in graph.children(shard_id):
            visit(child)

    for shard_id in sorted(known):
        if not any(p in known for p in graph.shards[shard_id].parents):
            visit(shard_id)
    order += [(shard_id, 0) for shard_id in sorted(set(extra) - known)]
    return order


def hash_share(starting_hash_key: int, ending_hash_key: int) -> str:
    """The part of the hash key space a shard covers, in percent: ``0.0-50.0%``."""
    low = 100 * starting_hash_key / HASH_KEY_SPACE
    high = 100 * (ending_hash_key + 1) / HASH_KEY_SPACE
    return f"{low:.1f}-{high:.1f}%"


def duration(seconds: float | None) -> str:
    """``0.8s``, ``42s``, ``3m05s``, ``2h10m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def lease_record(lease: Lease | None, live_workers: set[str]) -> dict[str, Any]:
    """A shard's lease in ``--json`` (``efo shards`` and ``efo checkpoints show``): without a lease,
    ``lease_state`` is ``no-lease`` and the rest null. ``lag_ms`` is the MillisBehindLatest its owner
    last wrote, as of ``checkpointed_at`` (null until an owner writes one, and once it is finished)."""
    if lease is None:
        return {
            "owner": None,
            "lease_state": lease_state(None, live_workers),
            "checkpoint": None,
            "checkpointed_at": None,
            "lag_ms": None,
            "reset_pending": None,
        }
    return {
        "owner": lease.owner,
        "lease_state": lease_state(lease, live_workers),
        "checkpoint": str(lease.checkpoint),
        "checkpointed_at": None if lease.updated_at is None else lease.updated_at.isoformat(),
        "lag_ms": None if lease.finished else lease.lag_ms,  # nothing is left to read
        "reset_pending": None if lease.reset is None else str(lease.reset.position),
    }


def lag_text(record: dict[str, Any]) -> str:
    """A :func:`lease_record`'s lag for people: ``4.2s``; ``-`` when none was written, or when no
    live worker reads the shard (the last lag written says nothing of the backlog growing since)."""
    if record["lag_ms"] is None or record["lease_state"] != "reading":
        return "-"
    return duration(record["lag_ms"] / 1000)
