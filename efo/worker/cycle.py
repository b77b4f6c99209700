"""The lease cycle (KCL's LeaseTaker; aiokafka's group coordinator and assignor).

Every ``lease.sync_interval_s`` (and at once when asked) it reads the lease table and acts on it,
in this order: a lease another worker took is dropped here; operators' resets are applied, and
other workers' handover requests (honoured, or declined when they come just after this worker
handed leases over down to its share: :func:`efo.leases.balance.answer_requests`); then its
moves are decided from what it sees and remembers (:func:`efo.worker.decision.decide`: no table, no
clock, tested alone) and it performs them: it claims free leases, hands over
what it holds above its share and asks for what it lacks; a lease asked for and neither handed
over nor declined within ``failover_s`` is taken; a shard gone from the stream before it was
finished is finished, so its children do not wait for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace

import structlog

from efo.clock import SYSTEM_CLOCK, Clock, Timer
from efo.concurrency import bounded, periodically
from efo.config import Settings
from efo.errors import LeaseLost
from efo.kinesis.graph import ShardGraph
from efo.leases import balance
from efo.leases.cache import LeaseCache
from efo.leases.cleanup import deletable
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import Lease, TableState
from efo.leases.readable import ReadableLeases
from efo.leases.readable import can_read as _can_read_among
from efo.leases.table import LeaseTable
from efo.leases.view import TableView
from efo.observability import METRICS
from efo.worker.decision import SETTLE_CYCLES, Memory, Seen, decide
from efo.worker.liveness import LeaseTrust
from efo.worker.membership import Membership
from efo.worker.owned import OwnedLeases
from efo.worker.runner import ShardRunner
from efo.worker.shardsync import ShardSync
from efo.worker.streams import StreamShares

log = structlog.get_logger("efo.worker.cycle")

#: Claims of one cycle go out this many at once.
CLAIM_CONCURRENCY = 16
#: Finished leases deleted after one listing at most (each moves its partition's version once a cycle).
DELETES_PER_LISTING = 64


class LeaseCycle:
    def __init__(
        self,
        *,
        settings: Settings,
        table: LeaseTable,
        owned: OwnedLeases,
        runner: ShardRunner,
        shards: ShardSync,
        stopping: asyncio.Event,
        trust: LeaseTrust,
        after_cycle: Callable[[], None] = lambda: None,
        shares: StreamShares | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._shares = shares or StreamShares()  # this worker's other streams, for its share of them all
        self._table = table
        self._owned = owned
        self._runner = runner
        self._shards = shards
        self._stopping = stopping
        self._trust = trust
        self._after_cycle = after_cycle
        self._clock = clock
        self._me = table.worker_id
        self._now = asyncio.Event()
        self.view = TableView(self._me, settings.lease.failover_s, settings.lease.heartbeat_interval_s, clock)
        self.membership = Membership(table, self.view, clock, stream=owned.stream)
        self.asked: dict[str, tuple[float, str | None]] = {}  # shards this worker asked for: when, and of whom
        self._memory = Memory()  # what the decision keeps from one cycle to the next
        self._unlisted_since: dict[str, float] = {}  # leases missing from the listing: first seen then
        self._cleaned_for = 0.0  # the listing (when it was asked for) the last deletion of finished leases followed
        self._gave_at: float | None = None  # when it last handed a lease over for balance (shed, asked, stranded)
        self._readable = ReadableLeases()  # the leases that can be read now, by owner
        self._cache = LeaseCache(table, settings.lease.full_read_interval_s, clock, stream=owned.stream)
        self.state: TableState | None = None  # the table as the last cycle saw it
        self._death_check: Timer | None = None  # a cycle when the next worker would turn dead
        self.read_at: float | None = None  # when it was read, for /readyz
        self.cycles = 0  # cycles run (with a read), for readiness
        self._log = log.bind(worker_id=self._me)

    def run_now(self) -> None:
        self._now.set()

    async def run(self) -> None:
        """A cycle every ``lease.sync_interval_s`` (sooner when asked), until cancelled."""
        try:
            await periodically(
                self._turn,
                interval_s=self._settings.lease.sync_interval_s,
                wake=self._now,
                log=self._log,
                failed="leases.cycle_failed",
                clock=self._clock,
            )
        finally:
            self.close()

    async def _turn(self) -> None:
        if not self._trust.in_doubt:
            await self._table.bump_again()
            state = await self.read()
            async with self._table.changing():  # the cycle's changes move each partition's version once
                await self.cycle(state)

    def leased(self) -> Collection[str] | None:
        """The shards with a lease, as of the last read (None: not read yet)."""
        return None if self.state is None else self.state.leases.keys()

    @property
    def live(self) -> AbstractSet[str]:
        """The workers alive as of the last read, this one among them."""
        return self.view.live

    @property
    def first_live(self) -> bool:
        """This worker comes first in name order among the live ones (it lists the stream)."""
        return self.cycles > 0 and min(self.view.live) == self._me

    async def read(self) -> TableState:
        """The table as this cycle sees it (see :class:`~efo.leases.cache.LeaseCache`)."""
        state = await self._cache.read()
        await self.membership.read(state.members, state.member_changes)
        self.view.saw_leaving(state.leaving)
        self.membership.saw_named(state.leaving, stopping=self._stopping.is_set())
        state.workers = dict(self.membership.rows)
        self.view.saw_leases(state.leases, answered_at=self._cache.answered_at, parts=state.parts)
        self.state = state
        self.read_at = self._cache.answered_at
        return self.state

    async def cycle(self, state: TableState) -> None:
        """One read of the table, acted on: losses, requests, resets, then claims and handovers."""
        self._watch_deaths()
        if not self._trust.in_doubt:
            await self.membership.act()
        METRICS.workers_live.labels(stream=self._owned.stream).set(len(self.view.live))
        self._check_owned(state)
        if self._stopping.is_set():  # a stop reading on: it watches its part of the ring, nothing more
            return
        await self._apply_resets(state)
        arn = self._table.stream_arn
        limit = self._settings.lease.max_leases_per_worker
        # Read once: another stream's cycle may publish while this one awaits its writes.
        rank_offset, room = self._shares.rank_offset(arn), self._shares.room(arn, limit)
        self._readable.update(state.leases, state.parts)  # what changed since the last cycle, and the children of that
        count = self._readable.count
        target = balance.target(
            self._me,
            count,
            self.view.live,
            max_leases=limit or None,
            rank_offset=rank_offset,
            room=room,
            leaving=self.view.leaving,
        )
        index = self._readable  # what _apply_requests looks at: this worker's leases in the table or here
        mine = {**index.owned_by(self._me), **{sid: lease for sid in self._owned if (lease := index.get(sid))}}
        await self._apply_requests(list(mine.values()), target)
        if self._trust.in_doubt:
            return
        handing_over = {sid for sid, owned in self._owned.items() if owned.phase is ShardPhase.RELEASING}
        readable, stranded = self._as_planned(handing_over)
        live = self.view.live
        METRICS.shards_unowned.labels(stream=self._owned.stream).set(
            sum(len(leases) for owner, leases in readable.items() if owner is None or owner not in live)
        )
        held = len(readable.get(self._me, {}))
        self._shares.publish(arn, readable=count, held=held)
        interval_s = self._settings.lease.sync_interval_s
        now, wall = self._clock.now(), self._clock.wall()
        seen = Seen(
            me=self._me,
            readable=readable,
            live=live,
            interval_s=interval_s,
            stranded=stranded,
            moved_recently=self.view.moved_within(SETTLE_CYCLES * interval_s)
            | {sid for sid, owned in self._owned.items() if not owned.phase.reading}  # draining: leave it be
            | {sid for sid, owned in self._owned.items() if owned.young(wall)},  # see OwnedShard.young
            reserved_for_others=self.view.reserved_for_others() | handing_over,
            asked=len(self.asked),
            max_leases=limit or None,
            max_steals=self._settings.lease.max_steals_per_cycle,
            rank_offset=rank_offset,
            exact=self._shares.several and self._same_streams(state),
            room=room,
            leaving=self.view.leaving,
            failover_s=self._settings.lease.failover_s,
            stopped=self.view.stopped_lately(),
            several_streams=self._shares.several,
        )
        moves, self._memory = decide(seen, self._memory, now)
        # What it will hold once these land, before any await: the next stream's room counts it (a
        # lease being shed still counts until its handover is done).
        self._shares.publish(arn, readable=count, held=held + len(moves.claim))
        # Fenced on each lease as it is in the table; a bounded number at once. A lease of a worker
        # thought dead is taken only once a fresh read of its heartbeat says so still.
        alive = await self._confirm_dead(lease.owner for lease in moves.claim)
        claims = [state.leases[lease.shard_id] for lease in moves.claim if lease.owner not in alive]
        lost: list[Lease] = []  # claimed first by another worker
        await bounded(CLAIM_CONCURRENCY, lambda lease: self._claim(lease, lost), claims)
        await self._claim_spares(moves.spare, len(lost), state)
        # Ours in the table but beyond this worker's share: others see them held by a live worker and
        # would never take them (a spread of one asks for nothing), so give them up now.
        for shard_id in sorted(stranded - {lease.shard_id for lease in moves.claim}):
            await self._release_stranded(state.leases[shard_id])
        for shard_id in moves.shed:
            owned = self._owned.get(shard_id)  # lost meanwhile (the claims above awaited): nothing to shed
            if owned is not None:
                self._runner.hand_over(owned, f"above this worker's share of {moves.target}")
                self._gave_at = now
        for lease in moves.ask:
            await self._ask(lease)
        await self._take_overdue(state, asked_now={lease.shard_id for lease in moves.ask})
        if self._shards.graph is not None:  # this worker lists the stream
            await self._finish_expired(state, self._shards.graph)
            await self._delete_finished(state, self._shards.graph)
        self.cycles += 1
        self._after_cycle()

    def _as_planned(self, handing_over: AbstractSet[str]) -> tuple[Mapping[str | None, Mapping[str, Lease]], set[str]]:
        """The readable leases by owner as the plan is to see them, and the stranded ones: a lease
        this worker is handing over is on its way (the asker's already, so nothing else is shed for
        it, or free for others); one that is this worker's in the table but not running here (after
        its leases were in doubt, a restart) is free, to be taken back. Only the groups these touch
        are copied: the rest are the index's own, read-only."""
        index = self._readable
        mine = index.owned_by(self._me)
        moved: dict[str, Lease] = {}
        for shard_id in sorted(handing_over):
            lease = index.get(shard_id)
            if lease is not None:
                moved[shard_id] = replace(lease, owner=lease.wanted_by if lease.wanted_by in self.view.live else None)
        stranded = {shard_id for shard_id in mine if shard_id not in self._owned}
        for shard_id in sorted(stranded):
            moved[shard_id] = replace(mine[shard_id], owner=None)
        if not moved:
            return index.by_owner, stranded
        grouped = dict(index.by_owner)
        copies: dict[str | None, dict[str, Lease]] = {}
        for shard_id, lease in moved.items():
            before = index.get(shard_id)
            assert before is not None
            for owner in (before.owner, lease.owner):
                if owner not in copies:
                    copies[owner] = dict(grouped.get(owner, {}))
                    grouped[owner] = copies[owner]
            del copies[before.owner][shard_id]
            copies[lease.owner][shard_id] = lease
        return grouped, stranded

    def _watch_deaths(self) -> None:
        """A cycle at the moment the first worker alive now would turn dead (if it does not beat
        before), not up to ``sync_interval_s`` after: its leases are taken that much sooner."""
        if self._death_check is not None:
            self._death_check.cancel()
            self._death_check = None
        death_at = self.membership.next_death_at()
        if death_at is not None:
            self._death_check = self._clock.call_later(max(0.0, death_at - self._clock.now()), self.run_now)

    async def _confirm_dead(self, owners: Iterable[str | None]) -> set[str]:
        """Of these lease owners, the ones thought dead (or in doubt) that a fresh, strongly consistent
        read of their heartbeat row shows alive after all: its counter moved since it was last seen.
        The read comes after this cycle's lease reads, so an owner seen writing a lease there (it
        claims only once a heartbeat of its landed) is seen beating here (race a of issue 37)."""
        alive: set[str] = set()
        for owner in sorted({owner for owner in owners if owner is not None and owner != self._me}):
            issued_at = self._clock.now()
            row = await self.membership.read_one(owner)
            if not self.view.confirm(owner, row, issued_at=issued_at, answered_at=self._clock.now()):
                self._log.info("worker.alive_after_all", owner=owner)
                alive.add(owner)
        return alive

    def close(self) -> None:
        if self._death_check is not None:
            self._death_check.cancel()
            self._death_check = None

    def _check_owned(self, state: TableState) -> None:
        """A lease another worker took (or reset) is dropped now, not at the next failed write. A lease
        with no owner one counter on, while this claim drains or releases, is its own finish or release,
        read between its landing and the write's return (the version write comes in between): that
        write's caller ends it. A counter below this claim's is an answer from before the claim
        (counters only grow), not a loss."""
        for owned in list(self._owned.values()):
            lease = state.leases.get(owned.shard_id)
            if lease is not None and lease.counter < owned.epoch:
                state.put(owned.lease)  # what the claim wrote, for this cycle's plan
                continue
            if (
                lease is not None
                and lease.owner is None
                and lease.counter == owned.epoch + 1
                and owned.phase in (ShardPhase.DRAINING, ShardPhase.RELEASING)
            ):
                continue
            if lease is None or lease.owner != self._me or lease.counter != owned.epoch:
                holder = f"{lease.owner} (counter {lease.counter})" if lease is not None else "nobody (row gone)"
                self._owned.lose(owned, f"the lease is now held by {holder}")

    async def _apply_resets(self, state: TableState) -> None:
        """Operators' resets, of finished leases first (their children may have to wait again)."""
        # Those the read showed with a reset (the view keeps them), and this worker's own leases: what a
        # claim wrote since the read (TableState.put) may carry one the read did not show.
        leases = (state.leases.get(shard_id) for shard_id in sorted(self.view.resets | set(self._owned)))
        pending = [lease for lease in leases if lease is not None and lease.reset is not None]
        for lease in sorted(pending, key=lambda lease: not lease.finished):
            assert lease.reset is not None
            owned = self._owned.get(lease.shard_id)
            if lease.finished and lease.owner is None:
                try:
                    state.put(await self._table.apply_reset(lease))
                    self._log.info("shard.reset", shard_id=lease.shard_id, position=str(lease.reset.position))
                except LeaseLost:
                    continue
            elif owned is not None and lease.counter == owned.epoch:
                await self._apply_reset(owned, lease, state)

    async def _apply_requests(self, readable: list[Lease], target: int) -> None:
        """Other workers' handover requests for leases read here, honoured or declined (cleared) as
        :func:`efo.leases.balance.answer_requests` decides: a request that comes within
        ``failover_s`` of this worker handing leases over, once it is at its share (``target``), was
        written from an older read; left standing, the asker would take the lease once overdue and
        this worker would be short in turn. A stopping or in-doubt worker declines nothing."""
        held = sum(
            1
            for lease in readable
            if lease.owner == self._me
            and (owned := self._owned.get(lease.shard_id)) is not None
            and owned.phase is not ShardPhase.RELEASING
        )  # as plan() counts it
        requested = {
            lease.shard_id: lease
            for lease in sorted(readable, key=lambda lease: lease.shard_id)
            if lease.wanted_by
            and (owned := self._owned.get(lease.shard_id)) is not None
            and owned.phase.reading
            and lease.counter == owned.epoch
        }
        honour, decline = balance.answer_requests(
            list(requested),
            held=held,
            target=target,
            gave_lately=self._gave_lately(),
            from_leaving={sid for sid, lease in requested.items() if lease.wanted_by in self.view.leaving},
        )
        for shard_id in honour:
            self._runner.hand_over(self._owned[shard_id], f"asked for by {requested[shard_id].wanted_by}")
            self._gave_at = self._clock.now()
        if self._stopping.is_set() or self._trust.in_doubt:
            return  # stopping: the release keeps the request, so the asker takes the lease first
        for shard_id in decline:
            lease = requested[shard_id]
            try:
                await self._table.decline(lease)
            except LeaseLost:
                continue
            self._log.info("lease.request_declined", shard_id=shard_id, asker=lease.wanted_by, target=target)

    def _gave_lately(self) -> bool:
        """This worker handed a lease over for balance (shed, asked, stranded) within ``failover_s``."""
        return self._gave_at is not None and self._clock.now() - self._gave_at < self._settings.lease.failover_s

    async def _apply_reset(self, owned: OwnedShard, lease: Lease, state: TableState) -> None:
        """Restart the shard at the reset position, here and now: a new claim (a new epoch), so what
        the old one handed on is committed but moves nothing."""
        assert lease.reset is not None
        await self._runner.stop_reading(owned)
        try:
            reset = await self._table.apply_reset(lease)
        except LeaseLost as exc:
            self._owned.lose(owned, str(exc))
            return
        if owned.phase.terminal or self._stopping.is_set():
            return
        owned.enter(ShardPhase.RELEASED)
        self._owned.forget(owned)
        owned.log.info("shard.reset", position=str(lease.reset.position))
        state.put(reset)
        if can_read(reset, state) and await self._parents_finished_now(reset, state.leases):  # strongly: unchecked
            self._runner.start(reset)
        else:  # its parents are to be read again first
            try:
                await self._table.release(reset)
            except LeaseLost:  # taken meanwhile (an overdue request, this worker thought dead): theirs now
                return

    async def _parents_finished_now(self, lease: Lease, seen: Mapping[str, Lease]) -> bool:
        """The parents this cycle's read (``seen``) cannot vouch for, read now (strongly consistent):
        every parent of a lease with a reset, or with one applied since its last claim (an operator's
        reset of every shard writes parents before children, and nothing else can un-finish a shard;
        but the partitions' versions move after every row, so a worker may see the child's reset,
        applied and released, before its parent's), and any parent it does not show. The lister
        writes a parent's lease before its child's, but in another partition: this cycle may have kept
        the parent's partition as before (an eventually consistent answer found behind, or one from a
        replica a moment older than the child's), and a parent without a lease counts as finished.
        Only a claim reads them, and only those: a parent that really has no lease (gone from the
        stream, or its finished lease deleted) costs one read a claim, and never stops the child."""
        for parent in lease.parents:
            if lease.reset is None and not lease.parents_unchecked and parent in seen:
                continue
            row = await self._table.read_lease(parent)
            if row is not None and (not row.finished or row.reset is not None):
                self._cache.stale(parent)  # read its partition again next cycle
                if parent not in seen:
                    self._log.info("lease.parent_unseen", shard_id=lease.shard_id, parent=parent)
                return False
        return True

    def _same_streams(self, state: TableState) -> bool:
        """Every live worker of this stream reads the same streams as this one (their heartbeat rows
        say which): only then do all deal the extra shards alike (efo.worker.streams)."""
        return all(
            state.workers[worker].reads == self._table.reads for worker in self.view.live if worker in state.workers
        )

    async def _claim_spares(self, spares: list[Lease], missing: int, state: TableState) -> None:
        """The next free leases in this worker's order, one after another, until as many are claimed
        as other workers claimed first of this cycle's (or none is left)."""
        for lease in spares:
            if missing <= 0:
                return
            if lease.owner is not None and await self._confirm_dead([lease.owner]):
                continue  # alive after all
            missing -= await self._claim(state.leases[lease.shard_id])

    async def _claim(self, lease: Lease, lost: list[Lease] | None = None) -> bool:
        """True if it claimed the lease (``lost``: where a lease another worker claimed first goes)."""
        seen = self.state.leases if self.state is not None else {}
        if not await self._parents_finished_now(lease, seen):
            return False  # the claim would start it before its parents (or apply a reset and do so)
        try:
            claimed = await self._table.claim(lease)
        except LeaseLost:
            if lost is not None:
                lost.append(lease)
            return False
        self.asked.pop(lease.shard_id, None)
        if self._trust.in_doubt or self._stopping.is_set():
            return True  # taken while this worker's leases went into doubt: claimed again once it is sure
        # Asked of a live worker (handed over, or taken overdue), not free or left by a dead one.
        stolen = lease.wanted_by == self._me or (
            lease.owner not in (None, self._me) and not self.view.owner_is_dead(lease.owner)
        )
        if lease.owner not in (None, self._me):
            self._log.info("lease.taken", shard_id=lease.shard_id, previous_owner=lease.owner)
        METRICS.lease_changes.labels(stream=self._owned.stream, reason="stolen" if stolen else "taken").inc()
        self._runner.start(claimed)
        return True

    async def _release_stranded(self, lease: Lease) -> None:
        try:
            await self._table.release(lease)
        except LeaseLost:
            return
        self._gave_at = self._clock.now()  # down to its share, as a shed is
        METRICS.lease_changes.labels(stream=self._owned.stream, reason="released").inc()
        self._log.info("lease.released_stranded", shard_id=lease.shard_id)

    async def _ask(self, lease: Lease) -> None:
        try:
            await self._table.want(lease)
        except LeaseLost:
            return
        self.asked[lease.shard_id] = (self._clock.now(), lease.owner)
        self._log.info("lease.asked", shard_id=lease.shard_id, owner=lease.owner)

    async def _take_overdue(self, state: TableState, asked_now: AbstractSet[str]) -> None:
        """A lease asked for and not handed over within ``failover_s`` is taken (fenced by the counter).
        ``asked_now``: asked in this cycle, after ``state`` was read (its request is not in it)."""
        for shard_id, (asked_at, asked_of) in list(self.asked.items()):
            if shard_id in asked_now:
                continue
            lease = state.leases.get(shard_id)
            if lease is None or lease.wanted_by != self._me or lease.finished:
                del self.asked[shard_id]  # taken, finished, or the request was cleared
                if lease is not None and lease.owner is not None and lease.owner == asked_of:
                    # Declined (still the same owner's: not taken by a third worker): its owner gave
                    # leases over lately and declines for failover_s after that; asking it again
                    # meanwhile would be refused (one above its share is asked instead).
                    not_before = self._clock.now() + self._settings.lease.failover_s
                    declined_by = {**self._memory.declined_by, lease.owner: not_before}
                    self._memory = replace(self._memory, declined_by=declined_by)
                continue
            if lease.owner is not None and self._clock.now() - asked_at >= self._settings.lease.failover_s:
                self._log.warning("lease.taken_overdue", shard_id=shard_id, owner=lease.owner)
                await self._claim(lease)
                self.asked.pop(shard_id, None)

    async def _finish_expired(self, state: TableState, graph: ShardGraph) -> None:
        """A shard gone from the stream (past its retention) before it was finished: nothing is
        left to read, and its children must not wait for it for ever. Gone means: missing from a
        listing asked for after its lease was first seen missing (another worker may have created
        the lease from a listing newer than this worker's)."""
        for shard_id in list(self._unlisted_since):
            if shard_id in graph.shards or shard_id not in state.leases:
                del self._unlisted_since[shard_id]
        for lease in state.leases.values():
            if lease.finished or lease.shard_id in graph.shards or lease.shard_id in self._owned:
                continue
            first_missing = self._unlisted_since.setdefault(lease.shard_id, self._clock.now())
            if self._shards.listed_at <= first_missing + 2 * self._settings.shards.sync_interval_s:
                self._shards.list_now()  # list again (and again) before calling it gone
                continue
            if lease.owner not in (None, self._me) and not self.view.owner_is_dead(lease.owner):
                continue
            try:
                claimed = await self._table.claim(lease)
            except LeaseLost:
                continue
            owned = self._owned.own(claimed)
            METRICS.shards_expired.labels(stream=self._owned.stream).inc()
            owned.log.warning("shard.expired", position=str(claimed.checkpoint))
            self._runner.end(owned, ())

    async def _delete_finished(self, state: TableState, graph: ShardGraph) -> None:
        """Delete the finished leases nothing can need any more (:mod:`efo.leases.cleanup`): once per
        listing, at most :data:`DELETES_PER_LISTING` of them."""
        if self._shards.listed_at <= self._cleaned_for:
            return
        self._cleaned_for = self._shards.listed_at
        found = deletable(state, graph, self._clock.wall(), self._settings.lease.delete_finished_after_s)
        for lease in found[:DELETES_PER_LISTING]:
            if await self._table.delete_finished(lease):
                self._log.info("lease.deleted", shard_id=lease.shard_id)

    async def release_untracked(self) -> int:
        """A stop's last sweep: a claim whose request was under way when the cycle was cancelled may
        have landed; release whatever the table still shows as this worker's."""
        state = await self._table.read()
        released = 0
        for lease in state.leases.values():
            if lease.owner == self._me:
                try:
                    await self._table.release(lease)
                    released += 1
                except LeaseLost:
                    continue
        return released


def can_read(lease: Lease, state: TableState) -> bool:
    """Can be read now: not finished, its parents finished. A parent without a lease is finished: it
    is gone from the stream, or its lease was deleted once it finished (:mod:`efo.leases.cleanup`);
    one this view does not show is read strongly before a claim (``LeaseCycle._parents_finished_now``).
    (Every lease cycle keeps these by owner: :class:`efo.leases.readable.ReadableLeases`.)"""
    return _can_read_among(lease, state.leases)


def parents_finished(lease: Lease, state: TableState, graph: ShardGraph) -> bool:
    for parent in lease.parents:
        parent_lease = state.leases.get(parent)
        if parent_lease is not None and not parent_lease.finished and parent in graph.shards:
            return False
    return True
