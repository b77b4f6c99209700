"""A bounded run (``efo run --until``, ``run.until``): where each shard's reading ends, and when the
whole worker is done.

**The rule, per shard** (one claim of it, :class:`ShardBound`):

- *caught up*: the first event of the claim with ``MillisBehindLatest`` = 0, once its records were
  handed on. Every record that arrived before that event was made (so: before the run started) has
  been handed on. Or, whichever comes first: once a record whose ApproximateArrivalTimestamp is at
  or after the run's start (this host's clock when the worker started) was handed on; arrival times
  within a shard are assumed not to go down, so every record that arrived before the run started
  has been handed on too. This is what ends a shard written faster than the sink commits, which
  never reports 0 ms behind. An open shard stays caught up; reading goes on until the worker stops, and what
  it reads meanwhile is delivered and checkpointed too. A shard that turns out to be **closed** (a
  split or a merge; the listing shows children) is not done by being caught up: it is read to its
  end (SHARD_END), and its children are read after it by the same rule.
- *at the time* (``--until TIME``): the first record whose ApproximateArrivalTimestamp is at or
  after TIME is not handed on, nor anything after it in the shard; the chunk it came in is cut just
  before it and the checkpoint is that record (AT_SEQUENCE_NUMBER), so the next run starts there.
  Reading stops (:attr:`~efo.leases.lifecycle.ShardPhase.AT_BOUND`), the lease is kept until the run
  ends. *Assumed*: a shard's arrival times do not go down (Kinesis assigns them with the sequence
  numbers; this is not a documented guarantee), so nothing after the cut arrived before TIME. If
  one did, it is not delivered by this run but by the next one, which starts at the cut: late,
  never lost. Its children (all their records are later still) are not read. A shard caught up
  before it reached TIME is done as above (TIME is not in the future, so everything before it has
  been read).
- *ended*: SHARD_END written (the children are then claimed and read by the same rule).

**The worker is done** (:meth:`RunEnd.done`) when, in a lease-table read made after a shard listing
that was asked for after the last of this worker's shards reached its bound or ended: every claim
it holds is at its bound (caught up and open in that listing, cut, or ended), every shard of the
listing has a lease, and every lease that can be read now (not finished, its parents finished) is
held by a live worker, this one among them only for claims running here. Then it stops reading,
waits for the sink to commit everything handed on, writes the final checkpoints, releases the
leases and exits 0. Several workers on one application each stop on their own: one that stops
first releases its leases, and a worker still running claims them and catches up on them (from
their checkpoints: little or nothing to read) before it stops in turn.

**A run that cannot end**: after ``run.max_duration_s`` the worker stops as on SIGTERM, except
that the sink is first given everything handed on (checkpoints written, leases released), and the
run exits 75 (``run.max_duration_reached``, :attr:`RunEnd.out_of_time`): what was read is
checkpointed, the next run reads on. A worker that had no successful shard listing, or no lease
table read, for ``run.shard_timeout_s`` cannot tell whether it is done: the run fails with
:class:`~efo.errors.ShardTimeout` (exit 1), naming which.

**A shard that never answers**: a claim short of its bound that has received no event for
``run.shard_timeout_s`` (not counting time waiting for pool budget) ends the run with
:class:`~efo.errors.ShardTimeout` (exit 1), naming the shard. So does a lease that can be read and
stays without a live owner that long (this worker cannot claim it: ``lease.max_leases_per_worker``
too low for the workers running), so that no wait of a bounded run is without an end.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Protocol, TypeVar

import structlog

from efo.clock import SYSTEM_CLOCK, Clock, wall_ms
from efo.config import RunSettings, Until
from efo.errors import LeaseLost, ShardTimeout
from efo.kinesis.graph import ShardGraph
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import TableState
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import ROW_COLUMNS, Position, RecordChunk

log = structlog.get_logger("efo.worker.bound")

T = TypeVar("T")

#: How often the worker checks whether it is done and whether a shard stalled.
CHECK_INTERVAL_S = 0.5


class BoundState(enum.Enum):
    READING = "reading"  # short of the run's end
    CAUGHT_UP = "caught_up"  # an event at 0 ms behind was handed on (done once the shard is known open)
    CUT = "cut"  # --until TIME: a record at or after TIME was seen; nothing more is handed on
    ENDED = "ended"  # SHARD_END written


BOUND_TRANSITIONS: dict[BoundState, frozenset[BoundState]] = {
    BoundState.READING: frozenset({BoundState.CAUGHT_UP, BoundState.CUT, BoundState.ENDED}),
    BoundState.CAUGHT_UP: frozenset({BoundState.CUT, BoundState.ENDED}),
    BoundState.CUT: frozenset(),
    BoundState.ENDED: frozenset(),
}


class IllegalBoundTransition(AssertionError):
    pass


class ShardBound:
    """One claim's progress towards the run's end. It stands between the claim's subscription and
    its ledger and the handoff (as the subscription's ``progress`` and ``handoff``): it sees each
    event's records before they are handed on, and cuts them at ``until``."""

    def __init__(
        self,
        owned: OwnedShard,
        until: Until,
        handoff: Handoff,
        pool: PendingPool,
        on_change: Callable[[ShardBound], None] = lambda bound: None,
        clock: Clock = SYSTEM_CLOCK,
        started_ms: int | None = None,
    ) -> None:
        self.owned = owned
        self._started_ms = started_ms  # the run's start (epoch ms): a record arrived since is "caught up"
        self._ledger = owned.ledger
        self._until_ms = until.time_ms
        self._handoff = handoff
        self._pool = pool
        self._on_change = on_change
        self._clock = clock
        self.state = BoundState.READING
        self.changed_at = clock.now()  # when it last changed state
        self.activity_at = clock.now()  # its last event (or the claim, or a wait for budget)
        self.records = 0  # handed on in this claim
        self.bytes = 0
        self.reached = asyncio.Event()  # CUT: reading stops
        self._pending: tuple[int, Position] | None = None  # the chunk announced and not yet put

    @property
    def shard_id(self) -> str:
        return self.owned.shard_id

    def enter(self, state: BoundState) -> None:
        if state is self.state:
            return
        if state not in BOUND_TRANSITIONS[self.state]:
            raise IllegalBoundTransition(f"shard {self.shard_id}: {self.state.name} -> {state.name}")
        self.state, self.changed_at = state, self._clock.now()
        self.owned.log.info("run.shard_at_bound", state=state.value, records=self.records, bytes=self.bytes)
        if state is BoundState.CUT:
            self.owned.series.stop_lag()  # nothing more is read here: its last lag is no one's lag
            self.reached.set()
        self._on_change(self)

    def done(self, graph: ShardGraph | None, listed_at: float) -> bool:
        """At the run's end: cut or ended; or caught up and open in a listing asked for since."""
        if self.state in (BoundState.CUT, BoundState.ENDED):
            return True
        if self.state is BoundState.CAUGHT_UP and graph is not None and listed_at >= self.changed_at:
            return self.shard_id in graph.shards and not graph.is_closed(self.shard_id)
        return False

    # ---- ShardProgress (the subscription's side), forwarded to the claim's ledger ---------------

    def next_serial(self) -> int:
        return self._ledger.next_serial()

    def started(self, first: Position) -> None:
        self._ledger.started(first)

    def enqueued(self, serial: int, resume: Position) -> None:
        self._pending = (serial, resume)  # the ledger hears of it with the chunk (put), maybe cut

    def idle(self, resume: Position) -> None:
        self.activity_at = self._clock.now()
        if self.state is BoundState.CUT:
            return  # past the cut: the checkpoint stays at the cut
        self._ledger.idle(resume)
        self._after_event(None)

    # ---- the handoff's side ---------------------------------------------------------------------

    def put(self, chunk: RecordChunk) -> None:
        assert self._pending is not None and self._pending[0] == chunk.serial, "enqueued() comes before put()"
        serial, resume = self._pending
        self._pending = None
        self.activity_at = self._clock.now()
        if self.state is BoundState.CUT:
            self._drop(chunk)
            return
        cut = self._cut_at(chunk)
        if cut is not None:
            resume = Position("AT_SEQUENCE_NUMBER", str(cut))
            _truncate(chunk, cut)
            if not len(chunk) and not chunk.dead_letters:
                self._drop(chunk)
                self.enter(BoundState.CUT)
                return
        self._ledger.enqueued(serial, resume)
        self._handoff.put(chunk)
        self.records += len(chunk)
        self.bytes += chunk.data_bytes
        if cut is not None:
            self.enter(BoundState.CUT)
        else:
            self._after_event(max(chunk.arrival_ms, default=None))

    def _after_event(self, latest_arrival_ms: int | None) -> None:
        """Caught up: at 0 ms behind, or a record that arrived since the run started was handed on."""
        if self.state is not BoundState.READING:
            return
        since_start = (
            self._started_ms is not None and latest_arrival_ms is not None and latest_arrival_ms >= self._started_ms
        )
        if self.owned.series.lag_ms == 0 or since_start:
            self.enter(BoundState.CAUGHT_UP)

    def _cut_at(self, chunk: RecordChunk) -> int | None:
        """The sequence number of the chunk's first record at or after ``until``, if any."""
        until_ms = self._until_ms
        if until_ms is None:
            return None
        late = [int(letter.sequence_number) for letter in chunk.dead_letters if letter.arrival_ms >= until_ms]
        arrivals = chunk.arrival_ms
        if arrivals and max(arrivals) >= until_ms:
            first = next(i for i, arrival_ms in enumerate(arrivals) if arrival_ms >= until_ms)
            late.append(int(chunk.sequence_numbers[first]))
        return min(late) if late else None

    def _drop(self, chunk: RecordChunk) -> None:
        """A chunk past the cut: never handed on, its budget returned."""
        if chunk.grant is not None:
            self._pool.release(chunk.grant)
            chunk.grant = None
        _truncate(chunk, -1)

    # ---- the runner's side ------------------------------------------------------------------------

    async def read(self, subscription: Coroutine[Any, Any, T]) -> T | None:
        """Run the subscription until it returns, or until the cut (then stop it: None).

        The cut wins over the subscription's end: the shard's last event may hold the cut record (the
        subscription returns ShardEnded in the same step), or the subscription may read on past the
        cut to SHARD_END. Either way the shard is at its bound, not ended: SHARD_END written over the
        cut's checkpoint would lose every record from the cut on."""
        task = asyncio.create_task(subscription)
        reached = asyncio.create_task(self.reached.wait())
        try:
            await asyncio.wait({task, reached}, return_when=asyncio.FIRST_COMPLETED)
            if self.reached.is_set():
                error = task.exception() if task.done() and not task.cancelled() else None
                if isinstance(error, LeaseLost):
                    raise error  # lost meanwhile: the runner lets it go
                return None
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        finally:
            for pending in (task, reached):
                if not pending.done():
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)


def _truncate(chunk: RecordChunk, cut: int) -> None:
    """Keep the chunk's rows (and dead letters) below sequence number ``cut`` (-1: none).

    Every column is cut first, by :meth:`RecordChunk.rows`, and only then
    assigned, so a failure leaves the chunk whole."""
    keep = 0
    if cut >= 0:
        while keep < len(chunk.sequence_numbers) and int(chunk.sequence_numbers[keep]) < cut:
            keep += 1
    kept = chunk.rows(0, keep)
    dead_letters = [letter for letter in chunk.dead_letters if cut >= 0 and int(letter.sequence_number) < cut]
    for name in (*ROW_COLUMNS, "data_bytes"):
        setattr(chunk, name, getattr(kept, name))
    chunk.dead_letters = dead_letters


class ShardListing(Protocol):
    """The last listing of the stream's shards, as the run's end reads it (efo.worker.shardsync.ShardSync)."""

    @property
    def graph(self) -> ShardGraph | None:
        """The shards as last listed (None: this worker has no listing, or an old one)."""
        ...

    @property
    def listed_at(self) -> float:
        """When the listing behind ``graph`` was asked for."""
        ...

    def list_now(self) -> None:
        """List again at once (a shard reached its bound: is it still open, has it children?)."""
        ...


class LeaseView(Protocol):
    """The lease cycle's last read of the table, as the run's end reads it (efo.worker.cycle.LeaseCycle)."""

    @property
    def state(self) -> TableState | None:
        """The table as last read (None: not read yet)."""
        ...

    @property
    def read_at(self) -> float | None:
        """When it was read."""
        ...

    @property
    def live(self) -> AbstractSet[str]:
        """The workers alive as of that read, this one among them."""
        ...


class RunEnd:
    """The worker's side of a bounded run: each claim's :class:`ShardBound`, whether the worker is
    done, the ``run.progress`` event and the shard timeout. It reads the claims held here
    (``owned``), the last shard listing (``listing``, asked for again when a claim reaches its
    bound) and the lease cycle's last read of the table (:meth:`connect`)."""

    def __init__(
        self,
        *,
        settings: RunSettings,
        until: Until,
        worker_id: str,
        handoff: Handoff,
        pool: PendingPool,
        owned: Mapping[str, OwnedShard],
        listing: ShardListing,
        parents_finished: Callable[[Any, TableState, ShardGraph], bool],
        clock: Clock = SYSTEM_CLOCK,
        stream: str = "",
    ) -> None:
        self._settings = settings
        self._stream = stream  # the stream's name, for the remaining-shards gauge
        self.until = until
        self._me = worker_id
        self._handoff = handoff
        self._pool = pool
        self._owned = owned
        self._listing = listing
        self._view: LeaseView | None = None  # connect()
        self._parents_finished = parents_finished
        self._clock = clock
        self._bounds: dict[str, ShardBound] = {}  # by shard, the current claim's
        self._done_here: set[str] = set()  # shards that reached the run's end here
        self._unclaimed_since: dict[str, float] = {}  # readable leases no live worker holds: since when
        self._last_change_at = clock.now()
        self.started_ms = wall_ms(clock)  # the run's start, the caught-up rule's "before the run"
        #: The run reached run.max_duration_s before its end: it stops, not done (exit 75).
        self.out_of_time = False
        self._records_before = 0  # of claims that are gone (released, lost, ended)
        self._bytes_before = 0
        self.finished = asyncio.Event()
        #: Called with :meth:`snapshot` at every check (a terminal display).
        self.on_progress: Callable[[dict[str, Any]], None] = lambda fields: None
        self._log = log.bind(worker_id=worker_id, until=str(until))
        self._started_at = clock.now()
        self._progress_at = clock.now()

    def connect(self, view: LeaseView) -> None:
        """Read the table through ``view`` (the lease cycle), which is built after this part: the
        cycle drives the shard runner, and the runner takes this part to bound each claim. Once,
        before :meth:`run` (or any check of the run's end)."""
        assert self._view is None, "connected already"
        self._view = view

    def _last_read(self) -> tuple[TableState | None, float | None, AbstractSet[str]]:
        """The lease cycle's last read of the table: what it found, when, and who was alive."""
        assert self._view is not None, "connect() the lease cycle first"
        return self._view.state, self._view.read_at, self._view.live

    # ---- claims -------------------------------------------------------------------------------

    def track(self, owned: OwnedShard) -> ShardBound:
        """The bound of a new claim."""
        old = self._bounds.pop(owned.shard_id, None)
        if old is not None:
            self._records_before += old.records
            self._bytes_before += old.bytes
        bound = ShardBound(
            owned, self.until, self._handoff, self._pool, self._changed, self._clock, started_ms=self.started_ms
        )
        self._bounds[owned.shard_id] = bound
        return bound

    def ended(self, owned: OwnedShard) -> None:
        """SHARD_END was written for this claim."""
        bound = self._bounds.get(owned.shard_id)
        if bound is not None and bound.owned is owned:
            bound.enter(BoundState.ENDED)

    def _changed(self, bound: ShardBound) -> None:
        self._last_change_at = self._clock.now()
        self._listing.list_now()  # a listing newer than the change: is the shard still open, are there children

    # ---- the worker ---------------------------------------------------------------------------

    def claim_done(self, owned: OwnedShard, graph: ShardGraph | None, listed_at: float) -> bool:
        bound = self._bounds.get(owned.shard_id)
        if bound is None or bound.owned is not owned:
            return False
        return (owned.phase.reading or owned.phase is ShardPhase.AT_BOUND) and bound.done(graph, listed_at)

    def remaining(self) -> tuple[list[str], int]:
        """The shards here or claimable that are short of the run's end, and how many are done here."""
        graph, listed_at = self._listing.graph, self._listing.listed_at
        state, _, live = self._last_read()
        short = []
        for shard_id, owned in self._owned.items():
            if self.claim_done(owned, graph, listed_at):
                self._done_here.add(shard_id)
            else:
                self._done_here.discard(shard_id)  # e.g. found closed: it is read to its end now
                short.append(shard_id)
        unclaimed = set()
        if state is not None and graph is not None:
            for lease in state.leases.values():
                if lease.finished or lease.shard_id not in graph.shards or lease.shard_id in self._owned:
                    continue
                if not self._parents_finished(lease, state, graph):
                    continue
                if lease.owner is None or lease.owner not in live or lease.owner == self._me:
                    short.append(lease.shard_id)
                    unclaimed.add(lease.shard_id)
        now = self._clock.now()
        self._unclaimed_since = {shard_id: self._unclaimed_since.get(shard_id, now) for shard_id in unclaimed}
        return short, len(self._done_here)

    def done(self) -> bool:
        """See the module's documentation: the worker has nothing left to read in this run."""
        graph, listed_at = self._listing.graph, self._listing.listed_at
        state, read_at, _ = self._last_read()
        if graph is None or state is None or read_at is None:
            return False
        if listed_at < self._last_change_at or read_at < listed_at:
            return False  # a listing (and a table read after it) newer than the last change here
        if graph.needing_leases(state.leases):
            return False  # a shard born since is about to get its lease
        short, _ = self.remaining()
        return not short

    async def run(self) -> None:
        """Check every CHECK_INTERVAL_S: a shard timed out (raise), progress due (log), done (set
        ``finished`` and return)."""
        while True:
            elapsed_s = self._clock.now() - self._started_at
            if elapsed_s >= self._settings.max_duration_s:
                self.out_of_time = True
                self.on_progress(self.progress())
                self._log.warning(
                    "run.max_duration_reached",
                    max_duration_s=self._settings.max_duration_s,
                    duration_s=round(elapsed_s, 3),
                    hint="stopping before the end (exit 75): what was read is checkpointed, run again to go on",
                )
                self.finished.set()
                return
            self._check_timeouts()
            self.on_progress(self.snapshot())
            if self._clock.now() - self._progress_at >= self._settings.progress_interval_s:
                self.progress()
            if self.done():
                self.on_progress(self.progress())
                self._log.info("run.reached_end", duration_s=round(self._clock.now() - self._started_at, 3))
                self.finished.set()
                return
            await self._clock.sleep(CHECK_INTERVAL_S)

    def _check_timeouts(self) -> None:
        now = self._clock.now()
        graph, listed_at = self._listing.graph, self._listing.listed_at
        timeout_s = self._settings.shard_timeout_s
        silent = []
        for owned in self._owned.values():
            bound = self._bounds.get(owned.shard_id)
            if bound is None or bound.owned is not owned or not owned.phase.reading:
                continue
            if owned.phase is ShardPhase.BACKPRESSURED or self.claim_done(owned, graph, listed_at):
                bound.activity_at = now  # waiting for the sink, or done: not silent
                continue
            if now - bound.activity_at > timeout_s:
                silent.append(owned.shard_id)
        unclaimed = sorted(sid for sid, since in self._unclaimed_since.items() if now - since > timeout_s)
        if unclaimed:
            raise ShardTimeout(
                f"{len(unclaimed)} shard(s) stayed without a live owner for {timeout_s:g} s (run.shard_timeout_s) "
                f"before reaching the run's end ({self.until}): {', '.join(unclaimed[:5])}; is "
                "lease.max_leases_per_worker too low for the workers running?"
            )
        _, read_at, _ = self._last_read()
        stale = [
            what
            for what, at in (("shard listing", listed_at if graph is not None else None), ("lease-table read", read_at))
            if now - max(at if at is not None else self._started_at, self._started_at) > timeout_s
        ]
        if stale and not silent:
            raise ShardTimeout(
                f"no {' and no '.join(stale)} succeeded for {timeout_s:g} s (run.shard_timeout_s): the worker cannot "
                f"tell whether the run ({self.until}) is done; what was read is checkpointed, run again"
            )
        if silent:
            raise ShardTimeout(
                f"{len(silent)} shard(s) received no event for {timeout_s:g} s (run.shard_timeout_s) before "
                f"reaching the run's end ({self.until}): {', '.join(sorted(silent)[:5])}; what was read is "
                "checkpointed, run again to finish"
            )

    def _cut(self, owned: OwnedShard) -> bool:
        bound = self._bounds.get(owned.shard_id)
        return owned.phase is ShardPhase.AT_BOUND or (
            bound is not None and bound.owned is owned and bound.state is BoundState.CUT
        )

    def progress(self) -> dict[str, Any]:
        """The ``run.progress`` event."""
        self._progress_at = self._clock.now()
        fields = self.snapshot()
        self._log.info("run.progress", **fields)
        return fields

    def snapshot(self) -> dict[str, Any]:
        """Shards done here of the shards here or claimable, records and bytes handed on, the
        slowest shard's lag (and the remaining-shards gauge set)."""
        short, done = self.remaining()
        lags = [  # not of a cut shard: nothing more is read there, its last lag is no one's lag
            owned.series.lag_ms
            for owned in self._owned.values()
            if owned.series.lag_ms is not None and not self._cut(owned)
        ]
        fields = {
            "shards_done": done,
            "shards_total": done + len(short),
            "records": self._records_before + sum(bound.records for bound in self._bounds.values()),
            "bytes": self._bytes_before + sum(bound.bytes for bound in self._bounds.values()),
            "max_lag_ms": max(lags) if lags else None,
            "duration_s": round(self._clock.now() - self._started_at, 3),
        }
        METRICS.run_shards_remaining.labels(stream=self._stream).set(len(short))
        return fields
