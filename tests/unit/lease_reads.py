"""The lease cycle as shard sync reads it (efo.worker.shardsync.LeaseReads), set by hand."""

from __future__ import annotations

from collections.abc import Collection


class Cycle:
    """The lease cycle as shard sync reads it: the leases of its last read, and whether this worker lists."""

    def __init__(self, leased: Collection[str] | None, *, first_live: bool = True) -> None:
        self.leased_now = leased
        self.first_live = first_live
        self.runs = 0

    def leased(self) -> Collection[str] | None:
        return self.leased_now

    def run_now(self) -> None:
        self.runs += 1
