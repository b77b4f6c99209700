"""A lease partition's rows, as a read of it found them, made into leases as cheaply as a read allows.

A partition is read again whole for one change in it (efo.leases.cache), so most of its rows are
as the last read found them: a row equal to the one read last is the same
:class:`~efo.leases.model.Lease` object, not parsed again, and the lease cycle looks only at leases
that are not the objects it saw last (efo.leases.changes). The simulation shares one
:class:`LeaseRows` among its workers (:class:`efo.sim.fleet.SharedLeaseRows`): its Query answers
every reader of one state of a partition with the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from efo.leases.codec import MARK_ATTRIBUTE, MARK_KEY, SHARD_PREFIX, parse_lease
from efo.leases.model import Lease

Item = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionRows:
    """One read of a lease partition. Read-only: readers may share it."""

    leases: dict[str, Lease]  # shard -> its lease
    mark: int | None  # the partition's copy of its version (None: no mark row yet)
    rows: dict[str, tuple[Item, Lease]]  # sort key -> the row as read and its lease


class LeaseRows:
    def __init__(self, parse: Callable[[Item], Lease] = parse_lease) -> None:
        self.parse = parse  # one lease row

    def read(self, items: list[Item], last: PartitionRows | None) -> PartitionRows:
        """The partition's rows as read now (``last``: this reader's previous read of it)."""
        known_rows = last.rows if last is not None else {}
        leases: dict[str, Lease] = {}
        rows: dict[str, tuple[Item, Lease]] = {}
        mark = None
        for item in items:
            sort_key = item["sk"]["S"]
            if not sort_key.startswith(SHARD_PREFIX):
                if sort_key == MARK_KEY and MARK_ATTRIBUTE in item:
                    mark = int(item[MARK_ATTRIBUTE]["N"])
                continue
            known = known_rows.get(sort_key)
            if known is not None and (known[0] is item or known[0] == item):
                lease = known[1]
            else:
                lease = self.parse(item)
            rows[sort_key] = (item, lease)
            leases[lease.shard_id] = lease
        return PartitionRows(leases, mark, rows)
