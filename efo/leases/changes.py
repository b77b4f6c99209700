"""Which leases changed from one read of the lease table to the next, at the cost of what changed.

A :class:`~efo.leases.model.Lease` is immutable, and the lease cache hands back the same object
while its partition is not read again; it also hands back each partition's leases as one mapping
(:attr:`TableState.parts <efo.leases.model.TableState.parts>`), the very same mapping while that
partition is not read again. So what changed is found by identity, partition by partition: a
partition that is the mapping seen last is skipped whole, and a cycle costs the partitions read
again, not every lease (at 16,384 shards, comparing every lease each cycle was most of what a
settled worker did). Without partitions (a state built elsewhere, or one the cycle changed:
:meth:`TableState.put <efo.leases.model.TableState.put>`) every lease is compared.
"""

from __future__ import annotations

from collections.abc import Mapping

from efo.leases.model import Lease

#: A shard, its lease as the last read showed it (None: new) and as this one does (None: gone).
Change = tuple[str, Lease | None, Lease | None]


class LeaseChanges:
    def __init__(self) -> None:
        self._last: dict[str, Lease] = {}  # every lease as the last read showed it
        self._parts: dict[int, Mapping[str, Lease]] = {}  # and by partition (empty: not known)

    def get(self, shard_id: str) -> Lease | None:
        """``shard_id``'s lease as the last read showed it."""
        return self._last.get(shard_id)

    def update(self, leases: Mapping[str, Lease], parts: Mapping[int, Mapping[str, Lease]]) -> list[Change]:
        """The leases of a new read (every lease there is; ``parts``: the same by partition, each
        shard in one, or empty), and what changed since the last: the leases that are not the very
        objects it showed, in the read's order, then those gone."""
        last = self._last
        if not (parts and self._parts):
            changes: list[Change] = [
                (shard_id, last.get(shard_id), lease)
                for shard_id, lease in leases.items()
                if last.get(shard_id) is not lease
            ]
            if len(leases) - sum(1 for _, before, _ in changes if before is None) != len(last):
                changes += [(shard_id, last[shard_id], None) for shard_id in last.keys() - leases.keys()]
            self._last = dict(leases)
        else:
            changes = []
            gone: dict[str, Change] = {}  # once each, should two partitions have held it
            for partition, part in parts.items():
                before = self._parts.get(partition, {})
                if before is part:
                    continue
                changes += [
                    (shard_id, last.get(shard_id), lease)
                    for shard_id, lease in part.items()
                    if last.get(shard_id) is not lease
                ]
                gone.update(
                    (shard_id, (shard_id, last.get(shard_id), None)) for shard_id in before.keys() - part.keys()
                )
            for partition in self._parts.keys() - parts.keys():
                gone.update((shard_id, (shard_id, last.get(shard_id), None)) for shard_id in self._parts[partition])
            # Not moved to another partition, nor gone already (from parts that did not equal leases).
            changes += [change for shard_id, change in gone.items() if shard_id not in leases and change[1] is not None]
            for shard_id, _, lease in changes:
                if lease is None:
                    del last[shard_id]
                else:
                    last[shard_id] = lease
        self._parts = dict(parts)
        return changes
