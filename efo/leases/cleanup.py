"""Which finished leases can be deleted: the KCL's rules (its LeaseCleanupManager), on efo's model.

Without deletion the lease rows grow with the stream's resharding history, and every full read of a
lease partition reads them all. A finished lease (SHARD_END, no owner, no pending reset) is deleted
once nothing can need it:

- it was finished at least ``lease.delete_finished_after_s`` ago (so a listing made since sees the
  stream as it is, and an operator looking at a reshard still sees the parents for a while);
- its parents' leases are gone already: a lineage is deleted from its oldest shard down, so a shard
  without a lease is only ever an ancestor of one with a lease (which is how the worker that lists
  the stream tells a deleted lease from a missing one: :meth:`efo.kinesis.shards.ShardGraph.needing_leases`,
  which also writes a lineage's missing leases parents first);
- every child has a lease (a missing parent counts as finished, so no child waits for it); the
  children are the listing's, or, for a shard gone from the stream (past its retention), the leases
  that name it as a parent.

The KCL also waits until each child's reading has begun (its checkpoint past TRIM_HORIZON or
AT_TIMESTAMP), because its shard sync writes leases for the ancestors of a child that has not begun.
efo's never writes a lease for an ancestor of a shard with one, so it need not wait: a child that
stays idle (an idle shard writes no checkpoint) would otherwise keep its parent's lease for ever.

Nothing is deleted while a worker of a release before deletion runs (its heartbeat row does not say
``deletes_leases``): that release writes a lease at TRIM_HORIZON for every listed shard without one,
so a deleted parent would be read again, after its children (a rolling deploy). (Rolling back to
such a release after leases were deleted does the same: see the README.)

The delete itself is conditional on the row as read (:meth:`efo.leases.table.LeaseTable.delete_finished`),
so an operator's reset written in between keeps it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from efo.kinesis.graph import ShardGraph
from efo.leases.model import Lease, TableState


def deletable(state: TableState, listing: ShardGraph, now: datetime, kept_s: float) -> list[Lease]:
    """The finished leases of ``state`` that can be deleted now, in shard order."""
    if any(not row.deletes_leases for row in state.workers.values()):
        return []  # a worker of a release that would write them again runs
    listed_children: dict[str, list[str]] = defaultdict(list)
    for shard in listing.shards.values():
        for parent in shard.parents:
            listed_children[parent].append(shard.shard_id)
    leased_children: dict[str, list[str]] = defaultdict(list)
    for lease in state.leases.values():
        for parent in lease.parents:
            leased_children[parent].append(lease.shard_id)
    found = []
    for shard_id in sorted(state.leases):
        lease = state.leases[shard_id]
        if not lease.finished or lease.owner is not None or lease.reset is not None:
            continue
        if lease.updated_at is None or (now - lease.updated_at).total_seconds() < kept_s:
            continue
        if any(parent in state.leases for parent in lease.parents):
            continue
        if shard_id in listing.shards:
            children = listed_children[shard_id]
            if not children:  # a closed shard always has children: this listing is not to be trusted
                continue
        else:
            children = leased_children[shard_id]
        if all(child in state.leases for child in children):
            found.append(lease)
    return found
