"""The leases that can be read now, by owner, kept from one read of the lease table to the next.

A lease can be read now when it is not finished and every parent of it is finished (a parent
without a lease is finished: gone from the stream, or its finished lease deleted; a claim reads such
a parent strongly first, since this view may be behind on its partition). Every lease
cycle needs them, grouped by owner (the shares, the loads, what is free); working them out from
every lease each cycle cost O(shards) a worker a second. :class:`ReadableLeases` looks only at the
leases that are not the very objects the last read showed (a :class:`~efo.leases.model.Lease` is
immutable, and the cache hands back the same object while its partition is not read again), and
at the children of those: a cycle costs what changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from efo.leases.changes import LeaseChanges
from efo.leases.model import Lease


def can_read(lease: Lease, leases: Mapping[str, Lease]) -> bool:
    """Not finished, and every parent finished (a parent without a lease is finished)."""
    if lease.finished:
        return False
    for parent in lease.parents:
        parent_lease = leases.get(parent)
        if parent_lease is not None and not parent_lease.finished:
            return False
    return True


class ReadableLeases:
    def __init__(self) -> None:
        self._changes = LeaseChanges()  # every lease as the last update showed it
        self._children: dict[str, set[str]] = {}  # parent shard -> the shards whose leases name it
        self._readable: dict[str, Lease] = {}
        self._by_owner: dict[str | None, dict[str, Lease]] = {}

    @classmethod
    def of(cls, leases: Mapping[str, Lease]) -> ReadableLeases:
        readable = cls()
        readable.update(leases)
        return readable

    @property
    def count(self) -> int:
        return len(self._readable)

    def get(self, shard_id: str) -> Lease | None:
        """``shard_id``'s lease if it can be read now."""
        return self._readable.get(shard_id)

    @property
    def by_owner(self) -> Mapping[str | None, Mapping[str, Lease]]:
        """Owner (None: nobody) -> its leases that can be read now (shard -> lease; in no order).
        Read-only: copy what is to be changed."""
        return self._by_owner

    def owned_by(self, owner: str | None) -> Mapping[str, Lease]:
        return self._by_owner.get(owner, {})

    def update(self, leases: Mapping[str, Lease], parts: Mapping[int, Mapping[str, Lease]] | None = None) -> None:
        """The leases as a new read shows them (every lease there is; ``parts``: the same by partition,
        if known: :mod:`efo.leases.changes`)."""
        touched: set[str] = set()
        for shard_id, before, after in self._changes.update(leases, parts or {}):
            if before is not None:
                for parent in before.parents:
                    children = self._children[parent]
                    children.discard(shard_id)
                    if not children:
                        del self._children[parent]
            if after is not None:
                for parent in after.parents:
                    self._children.setdefault(parent, set()).add(shard_id)
            touched.add(shard_id)
            touched.update(self._children.get(shard_id, ()))  # a parent finished, came or went
        for shard_id in touched:
            self._place(shard_id, leases)

    def _place(self, shard_id: str, leases: Mapping[str, Lease]) -> None:
        before = self._readable.pop(shard_id, None)
        if before is not None:
            bucket = self._by_owner[before.owner]
            del bucket[shard_id]
            if not bucket:
                del self._by_owner[before.owner]
        lease = leases.get(shard_id)
        if lease is not None and can_read(lease, leases):
            self._readable[shard_id] = lease
            self._by_owner.setdefault(lease.owner, {})[shard_id] = lease
