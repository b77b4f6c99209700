"""The checkpointer: the sink's commits become fenced checkpoint writes (KCL's checkpointer).

Each claim's :class:`~efo.leases.ledger.CheckpointLedger` says what is safe to write; this writes
it, conditional on the lease owner and counter, every ``checkpoint.interval_s`` and at once when a
ledger is urgent (a pin, SHARD_END). While the committed-but-unwritten backlog reaches
``pool.max_uncheckpointed_records`` (DynamoDB down or throttled) reading pauses, so the duplicates
a crash would cause stay bounded. A batch that stays in the sink for ``batch.stall_timeout_s``
stops the worker, so that its shards move to others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.concurrency import bounded
from efo.config import Settings
from efo.errors import EfoError, LeaseLost, SinkStalled
from efo.kinesis.subscription import Backoff
from efo.leases.ledger import RecordTally
from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END
from efo.worker.liveness import LeaseTrust
from efo.worker.owned import OwnedLeases

log = structlog.get_logger("efo.worker.checkpointer")

#: Checkpoint writes of one flush under way at once.
WRITE_CONCURRENCY = 16


class SharedBacklog:
    """The committed records not checkpointed yet of every stream a worker reads from one pool
    (efo.service gives one to each stream's checkpointer when it reads several): the pool's backlog
    bound counts them all, not one stream's."""

    def __init__(self) -> None:
        self._streams: dict[str, RecordTally] = {}  # stream name -> its held claims' backlog

    def count(self, stream: str, backlog: RecordTally) -> None:
        """``stream``'s claims count from now on (``backlog``: its OwnedLeases.backlog)."""
        self._streams[stream] = backlog

    def forget(self, stream: str) -> None:
        """``stream`` is read no more (read to a bound, deleted, failed): its claims no longer count."""
        self._streams.pop(stream, None)

    @property
    def records(self) -> int:
        return sum(backlog.records for backlog in self._streams.values())


class Checkpointer:
    def __init__(
        self,
        *,
        table: LeaseTable,
        owned: OwnedLeases,
        pool: PendingPool,
        settings: Settings,
        trust: LeaseTrust,
        on_shard_end: Callable[[OwnedShard], None] = lambda owned: None,
        shared_backlog: SharedBacklog | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``shared_backlog``: the backlog of every stream sharing the pool, when several do (None: the
        bound counts this stream's claims alone)."""
        self._table = table
        self.owned = owned
        self.pool = pool
        self._settings = settings
        self._trust = trust
        self._on_shard_end = on_shard_end
        self._clock = clock
        self._now = asyncio.Event()
        self.batch_started_at: float | None = None  # the driver's batch in the sink, for stall detection
        self._shared_backlog = shared_backlog
        if shared_backlog is not None:
            shared_backlog.count(owned.stream, owned.backlog)  # this stream's claims count from now on
        self._log = log.bind(worker_id=table.worker_id)

    # ---- the sink's side ----------------------------------------------------------------------

    def batch_started(self) -> None:
        self.batch_started_at = self._clock.now()

    def check_batch_progress(self) -> None:
        started = self.batch_started_at
        limit_s = self._settings.batch.stall_timeout_s
        if started is not None and self._clock.now() - started > limit_s:
            raise SinkStalled(
                f"a batch has been in the sink for more than {limit_s:g} s (batch.stall_timeout_s): "
                "stopping this worker so that its shards move to others"
            )

    def on_committed(self, commits: Iterable[Commit]) -> None:
        """The sink committed these chunks (loop thread): release budget, advance checkpoints."""
        self.batch_started_at = None
        stale = 0
        for commit in commits:
            if commit.grant is not None:
                self.pool.release(commit.grant)
            owned = self.owned.get(commit.shard_id)
            if owned is None or not owned.committed(commit):
                stale += 1  # an earlier claim's: its records are read again by the current owner
                continue
            owned.series.committed(commit.records, commit.bytes)
            if owned.ledger.urgent:
                self._now.set()
        if stale:
            self._log.debug("commit.stale", chunks=stale)
        self.apply_backlog_bound()

    def urge(self, owned: OwnedShard) -> None:
        """A claim's ledger may have become urgent: write at once rather than at the interval."""
        if owned.ledger.urgent:
            self._now.set()

    def backlog(self) -> int:
        """Committed records whose checkpoint is not written yet: of every stream sharing the pool,
        or of this stream's shards when it reads alone."""
        if self._shared_backlog is not None:
            return self._shared_backlog.records
        return self.owned.backlog.records

    def apply_backlog_bound(self) -> None:
        """Pause reading while too many committed records wait for their checkpoint (DynamoDB down
        or throttled), so the duplicates a crash would cause stay bounded."""
        backlog = self.backlog()
        bound = self._settings.pool.max_uncheckpointed_records
        if backlog >= bound and not self.pool.paused:
            self.pool.pause()
            self._log.warning("pool.paused", records=backlog, bound=bound)
        elif backlog < bound and self.pool.paused:
            self.pool.resume()
            self._log.info("pool.resumed", records=backlog)

    # ---- the writes ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Every ``checkpoint.interval_s`` every claim; urgent ones at once. Until cancelled."""
        interval_s = self._settings.checkpoint.interval_s
        due_at = self._clock.now() + interval_s  # one deadline, compared one way (no float asymmetry)
        while True:
            try:
                async with self._clock.timeout(max(0.0, due_at - self._clock.now())):
                    await self._now.wait()
            except TimeoutError:
                pass
            self._now.clear()
            force = self._clock.now() >= due_at
            await self.flush(force=force)
            if force:
                due_at = self._clock.now() + interval_s

    async def flush(self, *, force: bool) -> None:
        """The due checkpoints (all, or the urgent ones), a bounded number at once: one after the
        other, 256 shards' writes stretched the interval by a fifth under a slow DynamoDB."""
        if not self._trust.valid:
            return
        due = [owned for owned in self.owned.values() if force or owned.ledger.urgent]
        await bounded(WRITE_CONCURRENCY, self.write, due)

    async def write(self, owned: OwnedShard) -> None:
        """The claim's due checkpoint, fenced by its lease; a lost lease loses the claim. One write of
        a claim at a time, each of what is due when it starts: a checkpoint never moves back."""
        async with owned.writing:
            await self._write(owned)

    async def _write(self, owned: OwnedShard) -> None:
        due = owned.ledger.due
        if due is None or owned.phase.terminal:
            return
        if not self._trust.valid:
            return  # no heartbeat landed for too long: another worker may hold the lease by now
        records = owned.ledger.uncheckpointed_records
        started = self._clock.now()
        try:
            if due == SHARD_END:
                owned.lease = await self._table.finish(owned.lease)
            else:
                owned.lease = await self._table.checkpoint(owned.lease, due, lag_ms=owned.series.lag_ms)
        except LeaseLost as exc:
            METRICS.checkpoint_writes.labels(stream=self.owned.stream, outcome="conflict").inc()
            self.owned.lose(owned, str(exc))
            return
        except EfoError as exc:
            METRICS.checkpoint_writes.labels(stream=self.owned.stream, outcome="error").inc()
            if not exc.retriable:
                raise
            owned.log.warning("checkpoint.failed", error=str(exc), code=exc.code)
            return
        finally:
            METRICS.checkpoint_write_seconds.observe(self._clock.now() - started)
        METRICS.checkpoint_writes.labels(stream=self.owned.stream, outcome="ok").inc()
        if owned.phase.terminal:  # lost while the write was under way (it still landed, fenced)
            return
        owned.ledger.wrote(due, records)
        self.apply_backlog_bound()
        if due == SHARD_END:
            owned.enter(ShardPhase.ENDED)
            METRICS.lease_changes.labels(stream=self.owned.stream, reason="finished").inc()
            owned.log.info("checkpoint.shard_end", children=list(owned.children))
            self.owned.forget(owned)
            self._on_shard_end(owned)  # its children may start now
        else:
            owned.log.debug("checkpoint.written", position=str(due))

    async def pin(self, owned: OwnedShard) -> None:
        """LATEST and AT_TIMESTAMP name a moment: write the first event's position before any of its
        records moves on, so that no later claim (after a crash, a failover) starts from "now" again."""
        pin = owned.ledger.due
        if pin is None:  # a start that names a record already: nothing to pin
            return
        subscription = self._settings.subscription
        backoff = Backoff(subscription.backoff_initial_s, subscription.backoff_max_s)
        while owned.ledger.written != pin:
            if owned.phase.terminal:
                raise LeaseLost(f"lease of shard {owned.shard_id} lost before its start position was pinned")
            await self.write(owned)
            if owned.ledger.written != pin:
                await self._clock.sleep(backoff.next_delay_s())
