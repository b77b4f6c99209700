"""The life of one claimed shard, as an explicit state machine.

A claim starts when this worker takes a shard's lease (the lease counter after the take is the
claim's **epoch**: unique across workers and across re-claims in one process) and ends in exactly
one terminal phase, which is also the reason it stopped::

    SUBSCRIBING ⇄ READING ⇄ BACKPRESSURED        (reported by the subscription)
         │           │            │
         ├───────────┴────────────┴──▶ DRAINING ──▶ ENDED      shard end: last records committed,
         │                               │                       SHARD_END written, children may start
         ├──────────────▶ RELEASING ◀────┘ ──▶ RELEASED         asked to stop here: final checkpoint,
         │                    │       (──▶ ENDED if that was    lease given up for the next owner
         │                    │            the shard's end)
         │                    └──────────────▶ ABANDONED        the release did not land in time: the
         │                                                        lease stays this worker's in the table
         │                                                        until the lease cycle finds it
         └────────────────────┴──────────────▶ LOST             another worker holds the lease now

    SUBSCRIBING/READING/BACKPRESSURED ──▶ AT_BOUND ──▶ RELEASING | LOST
                                          a bounded run (``run.until``): the shard reached the run's
                                          end, reading stopped, the lease kept until the run ends

Every chunk this claim hands on carries its epoch, and so does the sink's commit of it: a commit
of an earlier claim (late, after a release and a re-claim) never reaches this claim's ledger.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.leases.ledger import CheckpointLedger
from efo.leases.model import Lease
from efo.observability import METRICS, ShardSeries
from efo.pipeline.pool import Grant
from efo.pipeline.records import Position, RecordChunk

#: Kinesis: a SubscribeToShard within 5 s of the last successful one (of the consumer and shard)
#: fails with ResourceInUse.
MIN_RENEW_INTERVAL_S = 5.0


class ShardPhase(enum.Enum):
    SUBSCRIBING = "subscribing"  # a SubscribeToShard call is being made, or retried after a backoff
    READING = "reading"  # events are arriving
    BACKPRESSURED = "backpressured"  # an event waits for pool budget
    DRAINING = "draining"  # the shard ended: its last records wait for the sink, then SHARD_END
    AT_BOUND = "at_bound"  # a bounded run: nothing more is read from it in this run; the lease is kept
    RELEASING = "releasing"  # intake stopped here: final checkpoint, then the lease is given up
    ENDED = "ended"  # SHARD_END written (terminal)
    RELEASED = "released"  # the lease was given up with its checkpoint (terminal)
    ABANDONED = "abandoned"  # reading stopped, but the release did not land: the lease cycle tidies up (terminal)
    LOST = "lost"  # another worker holds the lease now, or this one could not prove it still does (terminal)

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def reading(self) -> bool:
        """The subscription task runs in this phase."""
        return self in _READING


_READING = frozenset({ShardPhase.SUBSCRIBING, ShardPhase.READING, ShardPhase.BACKPRESSURED})
_TERMINAL = frozenset({ShardPhase.ENDED, ShardPhase.RELEASED, ShardPhase.ABANDONED, ShardPhase.LOST})
_STOPS = frozenset({ShardPhase.DRAINING, ShardPhase.AT_BOUND, ShardPhase.RELEASING, ShardPhase.LOST})

TRANSITIONS: dict[ShardPhase, frozenset[ShardPhase]] = {
    ShardPhase.SUBSCRIBING: frozenset({ShardPhase.READING, *_STOPS}),
    ShardPhase.READING: frozenset({ShardPhase.SUBSCRIBING, ShardPhase.BACKPRESSURED, *_STOPS}),
    ShardPhase.BACKPRESSURED: frozenset({ShardPhase.READING, ShardPhase.SUBSCRIBING, *_STOPS}),
    ShardPhase.DRAINING: frozenset({ShardPhase.ENDED, ShardPhase.RELEASING, ShardPhase.LOST}),
    ShardPhase.AT_BOUND: frozenset({ShardPhase.RELEASING, ShardPhase.LOST}),
    ShardPhase.RELEASING: frozenset({ShardPhase.RELEASED, ShardPhase.ABANDONED, ShardPhase.ENDED, ShardPhase.LOST}),
    ShardPhase.ENDED: frozenset(),
    ShardPhase.RELEASED: frozenset(),
    ShardPhase.ABANDONED: frozenset(),
    ShardPhase.LOST: frozenset(),
}


class IllegalTransition(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class Commit:
    """The driver's acknowledgement of one committed chunk: which claim, which chunk, its budget,
    and of which stream (the service hands each stream's commits to that stream's coordinator)."""

    shard_id: str
    epoch: int
    serial: int
    records: int
    grant: Grant | None = None
    bytes: int = 0
    stream: str = ""

    @classmethod
    def of(cls, chunk: RecordChunk) -> Commit:
        return cls(chunk.shard_id, chunk.epoch, chunk.serial, len(chunk), chunk.grant, chunk.data_bytes, chunk.stream)


@dataclass(eq=False)
class OwnedShard:
    """One claim of one shard: its lease, its ledger, its phase and its subscription task."""

    lease: Lease
    ledger: CheckpointLedger
    worker_id: str
    on_change: Callable[[OwnedShard], None] = lambda owned: None
    stream: str = ""  # the name of the shard's stream (its metrics' stream label)
    phase: ShardPhase = ShardPhase.SUBSCRIBING
    task: asyncio.Task[Any] | None = None
    first_event: bool = False
    #: When this claim last subscribed to its shard (a SubscribeToShard that succeeded), by the
    #: wall clock: written with its release, for the next owner (Lease.subscribed_at).
    subscribed_at: datetime | None = None
    #: A SubscribeToShard of this claim is under way: Kinesis may take it any moment (and count 5 s
    #: from it before the next owner's); not so for a claim only waiting to call again.
    calling: bool = False
    children: tuple[str, ...] = ()
    clock: Clock = SYSTEM_CLOCK
    claimed_at: float = field(init=False)
    phase_since: float = field(init=False)  # when it entered its phase (read by the health server's thread)
    log: Any = field(init=False)
    series: ShardSeries = field(init=False)  # its metrics (lag, records, bytes)
    #: Its checkpoint writes go one at a time (the periodic flush and a handover's may overlap), so
    #: an older position never lands after a newer one.
    writing: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.claimed_at = self.phase_since = self.clock.now()
        self.log = structlog.get_logger("efo.shard").bind(
            shard_id=self.shard_id, epoch=self.epoch, worker_id=self.worker_id
        )
        self.series = METRICS.shard(self.stream, self.shard_id, self.clock)

    def subscribed(self, at: datetime) -> None:
        """A SubscribeToShard of this claim succeeded, at ``at`` (the wall clock)."""
        self.subscribed_at = at

    def call_under_way(self, under_way: bool) -> None:
        """A SubscribeToShard of this claim was sent (True), or answered, failed or given up (False)."""
        self.calling = under_way

    def young(self, now: datetime) -> bool:
        """Its SubscribeToShard is under way or succeeded under MIN_RENEW_INTERVAL_S ago: given up
        now, the next owner's call would be refused until that long after it."""
        if self.calling:
            return True
        return self.subscribed_at is not None and (now - self.subscribed_at).total_seconds() < MIN_RENEW_INTERVAL_S

    @classmethod
    def claim(
        cls,
        lease: Lease,
        worker_id: str,
        on_change: Callable[[OwnedShard], None],
        *,
        start: Position | None = None,
        stream: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> OwnedShard:
        """A new claim of ``lease``, read from ``start`` (default: its checkpoint)."""
        assert lease.owner == worker_id, (lease.owner, worker_id)
        return cls(lease, CheckpointLedger(start or lease.checkpoint), worker_id, on_change, stream, clock=clock)

    @property
    def shard_id(self) -> str:
        return self.lease.shard_id

    @property
    def epoch(self) -> int:
        """The claim: the lease counter this worker set when it took the lease."""
        return self.lease.counter

    def enter(self, phase: ShardPhase) -> None:
        """Move to ``phase``; a move the diagram above does not allow is a bug and raises."""
        if phase is self.phase:
            return
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"shard {self.shard_id} epoch {self.epoch}: {self.phase.name} -> {phase.name}")
        self.phase_since = self.clock.now()  # first: the HTTP thread never sees the new phase with the old time
        previous, self.phase = self.phase, phase
        self.log.debug("shard.phase", phase=phase.value, previous=previous.value)
        if phase is ShardPhase.READING and not self.first_event:
            self.first_event = True
            self.log.info("shard.first_event", after_s=round(self.clock.now() - self.claimed_at, 3))
        self.on_change(self)

    def committed(self, commit: Commit) -> bool:
        """Apply the sink's commit if it belongs to this claim; False for an earlier claim's."""
        assert commit.shard_id == self.shard_id
        if commit.epoch != self.epoch or self.phase.terminal:
            return False
        self.ledger.committed(commit.serial, commit.records)
        return True
