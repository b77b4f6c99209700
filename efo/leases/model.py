"""The lease table's model: what a lease, a worker's heartbeat row, the first start's meta row and a
read of the table hold, and which lease partition holds a shard. No AWS client here: the gateway
(:mod:`efo.leases.table`) reads and writes these, and everything that only looks at them (the lease
cycle's decisions, balance, clean-up, the CLI's views, the simulation's checks) imports this alone.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from efo.pipeline.records import Position

#: Lease partitions at the first start: one per this many shards, at least MIN_LEASE_PARTITIONS. A
#: partition key serves 1,000 writes a second: 64 busy shards checkpointing every 5 s write 13; and a
#: partition that every worker reads after a change stays small (README "What the lease plane costs").
SHARDS_PER_LEASE_PARTITION = 64
MIN_LEASE_PARTITIONS = 8


def lease_partitions_for(shards: int) -> int:
    return max(MIN_LEASE_PARTITIONS, math.ceil(shards / SHARDS_PER_LEASE_PARTITION))


def lease_partition_of(shard_id: str, partitions: int) -> int:
    """Which lease partition holds ``shard_id``'s row: stable across processes and releases."""
    return zlib.crc32(shard_id.encode()) % partitions


#: The meta row's ``layout_format`` that this release reads: 1, lease partitions in generations
#: (``lease_generations``). A table of a later format is refused (:class:`~efo.errors.LayoutOutdated`).
LAYOUT_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Layout:
    """The lease partitions of an application's table, in generations: the first start's (``sizes[0]``
    partitions, numbered from 0), then each one a growth added (numbered after all before it). Leases
    never move: a lease is written once, in a partition of the newest generation its writer knew (by
    CRC-32 of the shard id within that generation), and the shard's reservation row (in its partition
    of generation 0) names that partition, so that writers that know different generations agree."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"a layout has at least one generation of at least one partition, not {self.sizes}")

    @property
    def partitions(self) -> int:
        """Every lease partition, of every generation."""
        return sum(self.sizes)

    @property
    def grown(self) -> bool:
        return len(self.sizes) > 1

    def candidate(self, shard_id: str, generation: int) -> int:
        """The one partition of ``generation`` that may hold ``shard_id``'s lease."""
        return self.base(generation) + lease_partition_of(shard_id, self.sizes[generation])

    def home(self, shard_id: str) -> int:
        """``shard_id``'s partition of generation 0: its reservation row, and its lease if written there."""
        return lease_partition_of(shard_id, self.sizes[0])

    def newest(self, shard_id: str) -> int:
        """Where a lease of ``shard_id`` written now goes: its partition of the newest generation."""
        return self.candidate(shard_id, len(self.sizes) - 1)

    def base(self, generation: int) -> int:
        """The first partition of ``generation``."""
        return sum(self.sizes[:generation])

    def grown_for(self, newest_rows: int, open_shards: int) -> Layout | None:
        """This layout with one generation more, if the newest generation holds more lease rows than it
        should (SHARDS_PER_LEASE_PARTITION a partition: every new lease goes there, a finished one stays
        until it is deleted), sized for twice the open shards (or those rows), so that the stream may
        double before the next. None: no growth is due."""
        if newest_rows <= SHARDS_PER_LEASE_PARTITION * self.sizes[-1]:
            return None
        return Layout((*self.sizes, lease_partitions_for(2 * max(open_shards, newest_rows))))


@dataclass(frozen=True, slots=True)
class PendingReset:
    """An operator's ``efo checkpoints reset``: the owner applies it (or whoever claims it next)."""

    reset_id: str
    position: Position


@dataclass(frozen=True, slots=True)
class Lease:
    shard_id: str
    parents: tuple[str, ...]
    owner: str | None
    counter: int  # +1 at every change of owner: the epoch of a claim, and the fence of every write
    checkpoint: Position  # where the shard resumes, or SHARD_END
    updated_at: datetime | None = None  # when the checkpoint was written (or the lease created)
    wanted_by: str | None = None  # a worker asked the owner to hand the lease over (a steal)
    reset: PendingReset | None = None
    lag_ms: int | None = None  # MillisBehindLatest of the owner's last event, as of updated_at
    #: When the owner that released it last subscribed to its shard (a SubscribeToShard that
    #: succeeded), by its clock: Kinesis refuses the next owner's call until 5 s after that.
    subscribed_at: datetime | None = None
    #: An operator's reset was applied here without a claim (by its owner, or to a finished lease):
    #: its parents may have been reset too, which a worker's view may not show yet, so the next claim
    #: reads them strongly (and clears this).
    parents_unchecked: bool = False

    @property
    def finished(self) -> bool:
        """The sink committed the shard's last record: its children may start. (The kind alone
        says so, SHARD_END being its one value; every lease cycle asks this of every lease.)"""
        return self.checkpoint.kind == "SHARD_END"


@dataclass(frozen=True, slots=True)
class Meta:
    """The application's first start: of which stream, from where, when, and whether every lease of
    it is written (a worker that dies half-way leaves it incomplete; the next one completes it)."""

    stream_created_at: datetime
    initial_position: str
    started_at: datetime | None = None
    complete: bool = True
    bootstrapper: str | None = None  # the worker that wrote it, and writes the first start's leases
    lease_partitions: int | None = None  # None: a table written before lease partitions (to migrate)
    #: The lease partitions' generations (a table never grown: one, ``lease_partitions``).
    lease_generations: tuple[int, ...] = ()
    layout_format: int = 0  # 0: a table never grown; LAYOUT_FORMAT, or later: ``lease_generations`` holds it

    @property
    def layout(self) -> Layout | None:
        """The lease partitions (None: a table of the layout before them)."""
        if self.lease_generations:
            return Layout(self.lease_generations)
        return Layout((self.lease_partitions,)) if self.lease_partitions is not None else None


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One worker's heartbeat row: what it runs and reads through, and when it last wrote."""

    worker_id: str
    heartbeat: int
    updated_at: datetime | None
    version: str | None = None
    started_at: datetime | None = None
    consumer_arn: str | None = None
    reads: str | None = None  # which streams the worker reads (a digest of their ARNs; None: one, or older)
    in_doubt: bool = False  # it wrote this while it did not trust its leases (it reads nothing)
    #: It is stopping (it still reads and holds its leases for a few seconds): the others watch its
    #: part of the ring from now (efo.leases.view.TableView.watched).
    leaving: bool = False
    #: Its release deletes finished leases, and so never writes again the lease of a shard that a leased
    #: shard descends from (False: a release before that, which would: efo.leases.cleanup waits for it).
    deletes_leases: bool = False
    #: Its release reads the lease partitions' generations and writes a reservation before each new lease
    #: (False: a release before, which would miss the leases of a grown table: no growth while it runs).
    reads_generations: bool = False


@dataclass(frozen=True, slots=True)
class MemberChange:
    """One move of the membership counter as the version row names it: the workers it was about, and
    of those the one whose own stop it ended with every lease released (its row gone)."""

    about: frozenset[str]
    stopped: frozenset[str] = frozenset()


@dataclass(slots=True)
class TableState:
    meta: Meta | None = None
    workers: dict[str, WorkerRow] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)  # lease partition -> its version (none yet: 0)
    members: int = 0  # moved by every change of who is alive: a start, a stop, a death, doubt
    leaving: frozenset[str] = frozenset()  # the workers the version row names as stopping
    #: The last moves of ``members`` the version row names (efo.leases.codec.MEMBER_CHANGE_PREFIX):
    #: the counter each set -> the workers whose rows it was about.
    member_changes: dict[int, MemberChange] = field(default_factory=dict)
    #: The same leases by lease partition, each partition's the very mapping of the read before while
    #: that partition was not read again (efo.leases.changes); empty: not known. Read-only.
    parts: dict[int, Mapping[str, Lease]] = field(default_factory=dict)

    def put(self, lease: Lease) -> None:
        """``lease`` in place of the one read (what this worker wrote since): the partitions no longer
        say what changed."""
        self.leases[lease.shard_id] = lease
        self.parts = {}

    @property
    def heartbeats(self) -> dict[str, int]:
        return {worker_id: row.heartbeat for worker_id, row in self.workers.items()}
