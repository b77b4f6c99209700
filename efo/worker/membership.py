"""Who is alive, read in a number of rows that grows with the workers, not with their square.

Every worker writes its heartbeat row every ``heartbeat_interval_s``. Reading every row every cycle,
as every worker did, costs W rows a worker a second: W² for the fleet, about 4,000 read units a
second on one partition key at 256 workers. Instead:

- **The membership counter.** The version row, which every cycle reads anyway, carries a counter
  (``members``) that moves whenever who is alive changes: a worker that starts (once its first
  heartbeat landed), stops (once its row is removed), recovers from doubt, or is found dead or in
  doubt by those who watch it. Each move names the workers it is about (the version row keeps the
  last :data:`~efo.leases.codec.MEMBER_CHANGE_SLOTS`: :meth:`~efo.leases.table.LeaseTable.members_changed`):
  when it moved, a cycle reads those rows, strongly (a few GetItems), if the version row names every
  move since its last read, else (or when that Query would cost no more: a small fleet) every
  heartbeat row (one Query). A stop or a death in a fleet of W
  workers so costs the control key about W read units, not W² / 14 (every worker reading every row
  of about 290 bytes: 4,800 in one second at 256 workers, against the 3,000 the key serves).
- **Watching.** Each cycle reads the rows of the :data:`WATCHED` workers after this one, in name
  order around the ring (so each worker is watched by the ones before it): a few GetItems,
  eventually consistent. A watched worker whose counter did not change for ``failover_s`` is dead:
  its row is deleted (if still as read: :meth:`~efo.leases.table.LeaseTable.reap_worker`) and the
  counter moved, naming it, so every worker reads its row again, finds none, and takes its leases.
  One whose row says it is in doubt, or no longer, moves the counter too, and so does a watcher that
  finds a watched row gone that no move named by its next cycle (a stop whose delete landed but
  whose own move of the counter did not). A stopping worker says so in its heartbeats as its stop
  begins (``leaving``): the ones before it count their watched past it (:meth:`TableView.watched`),
  so its part of the ring is watched while it still reads for a few seconds. A worker that joins or
  leaves moves others' places on the ring: a worker keeps watching the last :data:`WATCHED` it no longer
  watches for ``failover_s`` more, so a death is found in time by whoever watched it from before (a
  newcomer counts a row's age only from its own first read of it).
- **The safety net.** Every row is read again about every :data:`ALL_ROWS_EVERY_S` (at a random
  moment of its second half): a death whose watchers died with it is found then.

The watched rows are read eventually consistent: a stale answer can only make a worker look older
(it is then read again strongly before any of its leases is taken: :meth:`efo.worker.cycle.LeaseCycle`),
and every deletion is conditional on the counter read. The rows a move names, and every row, are
read strongly: they follow a change of who is alive, and a stale answer would show a reaped row,
alive again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol

import structlog

from efo.clock import Clock
from efo.errors import EfoError
from efo.leases.codec import MEMBER_CHANGE_SLOTS
from efo.leases.model import MemberChange, WorkerRow
from efo.leases.view import TableView
from efo.observability import METRICS

log = structlog.get_logger("efo.worker.membership")

#: How many workers after it in name order each worker reads every cycle.
WATCHED = 2
#: About what a heartbeat row weighs (measured in the simulated table: 290 bytes), and what one read
#: unit reads: a move naming as many rows as one Query of every row costs is read as that Query.
ROW_BYTES = 300
READ_UNIT_BYTES = 4096
#: Every heartbeat row is read again about this often (strongly consistent: a few hundred bytes a
#: worker), from half of it to all of it.
ALL_ROWS_EVERY_S = 60.0
JITTER_FROM = 0.5


class HeartbeatRows(Protocol):
    """What membership uses of the lease table (:class:`efo.leases.table.LeaseTable`)."""

    worker_id: str

    async def read_workers(self, *, consistent: bool = False) -> dict[str, WorkerRow]: ...
    async def read_some_workers(
        self, worker_ids: Iterable[str], *, consistent: bool = False
    ) -> dict[str, WorkerRow | None]: ...
    async def read_worker(self, worker_id: str) -> WorkerRow | None: ...
    async def reap_worker(self, worker_id: str, heartbeat: int) -> bool: ...
    async def members_changed(
        self, *, not_leaving: Iterable[str] = (), about: Iterable[str] = (), stopped: bool = False
    ) -> None: ...


class Membership:
    def __init__(
        self,
        table: HeartbeatRows,
        view: TableView,
        clock: Clock,
        rng: Callable[[], float] = random.random,
        *,
        stream: str = "",
    ) -> None:
        self._table = table
        self._reads = METRICS.lease_reads.labels(stream=stream, rows="heartbeats")
        self._view = view
        self._clock = clock
        self._rng = rng
        self._members: int | None = None  # the counter as of the last read of every row, or of those named
        self._full_due = 0.0
        self._doubting: set[str] = set()  # watched workers whose row said "in doubt", at the last read
        self._ring: set[str] = set()  # the WATCHED after this one around the ring, at the last read
        self._watched_until: dict[str, float] = {}  # no longer on the ring's part: watched until then
        self.watching: set[str] = set()  # the rows each cycle reads: the ring's part, and those still watched
        self.rows: dict[str, WorkerRow] = {}  # every row as last read (the watched ones since)
        self.announce = True  # this worker's own change to announce (its start, its recovery)
        #: Watched rows found gone by a read of the watched ones: their workers stopped (or were reaped)
        #: and the counter may not have moved for them (the delete landed, the answer was lost).
        #: Announced if no move names them by the next cycle (it usually follows the delete at once).
        self._gone_seen: set[str] = set()
        self._gone: set[str] = set()
        #: Names to strike off the version row's stopping ones, each a reason to move the counter,
        #: kept until a move lands: its own at its start (a stop of its own before may have left its
        #: name) and whenever it finds itself named while not stopping (:meth:`saw_named`), and the
        #: workers it reaped.
        self._struck: set[str] = {table.worker_id}
        #: Names the version row gives as stopping whose workers have no row (a stop whose own move
        #: was lost, a worker that died in its stop): struck by the next move, not a reason for one.
        self._riders: set[str] = set()
        self._log = log.bind(worker_id=table.worker_id)

    async def read(self, members: int, changes: Mapping[int, MemberChange] | None = None) -> None:
        """The heartbeat rows this cycle needs: when the counter moved, those of the workers the
        moves since the last read were about (``changes``: the counter each set -> those workers),
        strongly, or every one when a move is not named (or the safety net is due); and the watched
        ones, as every cycle."""
        issued_at = self._clock.now()
        named: set[str] = set()
        if members != self._members or issued_at >= self._full_due:
            moves = self._moves(members, changes or {})
            if moves is not None:
                self._view.saw_stopped(set().union(*(move.stopped for move in moves)))
            about: set[str] = set() if moves is None else set().union(*(move.about for move in moves))
            named = about - {self._table.worker_id}
            full = moves is None or issued_at >= self._full_due
            if full or len(named) * READ_UNIT_BYTES >= len(self.rows) * ROW_BYTES:
                await self._read_all(members, issued_at)  # as cheap as those rows (a small fleet), or needed
                return
            if named:
                self._reads.inc(len(named))
                rows = await self._table.read_some_workers(sorted(named), consistent=True)  # a reap: gone
                self._saw(rows, issued_at)
                issued_at = self._clock.now()
            # Only once they are read: a read that failed is made again at the next cycle.
            self._members = members
            self._gone -= about
            self._gone_seen -= about
        asked = sorted(self.watching - named)
        self._reads.inc(len(asked))
        watched = await self._table.read_some_workers(asked)
        self._gone |= self._gone_seen  # kept until a move names them
        self._gone_seen = {worker for worker, row in watched.items() if row is None and worker in self.rows}
        self._saw(watched, issued_at)

    async def _read_all(self, members: int, issued_at: float) -> None:
        """Every heartbeat row (one Query), strongly consistent: after a reap, that row is gone."""
        self._reads.inc()
        rows = await self._table.read_workers(consistent=True)
        answered_at = self._clock.now()
        self.rows = dict(rows)
        self._view.saw_workers(rows, issued_at=issued_at, answered_at=answered_at, complete=True)
        self._members = members
        self._gone, self._gone_seen = set(), set()  # every row read: nothing to tell
        self._full_due = issued_at + ALL_ROWS_EVERY_S * (JITTER_FROM + (1 - JITTER_FROM) * self._rng())
        self._rewatch()

    def _moves(self, members: int, changes: Mapping[int, MemberChange]) -> list[MemberChange] | None:
        """The moves since the last read, if the version row names them all."""
        if self._members is None or not self._members < members <= self._members + MEMBER_CHANGE_SLOTS:
            return None
        moves = [changes.get(moved_to) for moved_to in range(self._members + 1, members + 1)]
        return None if None in moves else [move for move in moves if move is not None]

    def _saw(self, rows: Mapping[str, WorkerRow | None], issued_at: float) -> None:
        """Some heartbeat rows (None: that worker has none), read from ``issued_at`` until now."""
        for worker, row in rows.items():
            if row is None:
                self.rows.pop(worker, None)
            else:
                self.rows[worker] = row
        self._view.saw_workers(rows, issued_at=issued_at, answered_at=self._clock.now(), complete=False)
        self._rewatch()

    def _rewatch(self) -> None:
        """Who to watch after a read: the ring's part, and for ``failover_s`` the last :data:`WATCHED`
        that left it (a mass start moves every worker's part many times: the cost stays at most twice
        the ring's), each for as long as it is found dead too (a slow read may find it so after its
        time: it is reaped, or beats again)."""
        now = self._clock.now()
        ring = set(self._view.watched(WATCHED))
        for worker in sorted(self._ring - ring):
            self._watched_until.pop(worker, None)  # newest last
            self._watched_until[worker] = now + self._view.failover_s
        self._ring = ring
        known, dead = self._view.known(), self._view.dead
        kept = [
            (worker, until)
            for worker, until in self._watched_until.items()
            if (until > now or worker in dead) and worker in known and worker not in ring
        ]
        self._watched_until = dict(kept[-WATCHED:])
        self.watching = ring | self._watched_until.keys()

    async def read_one(self, worker: str) -> WorkerRow | None:
        """One worker's row, strongly consistent (None: it has none), to confirm a death before taking."""
        self._reads.inc()
        return await self._table.read_worker(worker)

    def saw_named(self, named: AbstractSet[str], *, stopping: bool) -> None:
        """The workers the version row names as stopping, as this cycle read it (after :meth:`read`).
        Its own name is struck if this worker is not stopping (a stop's write that landed late, under
        the name of a worker that started again: counting no share for it, the others would never
        ask), and never while it is; names without a row ride along the next move."""
        me = self._table.worker_id
        if stopping:
            self._struck.discard(me)
        elif me in named:
            self._struck.add(me)
        self._riders = set(named) - self.rows.keys() - {me}

    async def act(self) -> None:
        """Announce this worker's own change; reap the watched workers found dead; tell of those found
        in doubt, or no longer. Each moves the membership counter, and strikes the names due off the
        version row's stopping ones. What is to announce stays so until a move lands; a reap that
        fails (throttled) is tried again at the next cycle and holds up no other."""
        moved = self.announce or bool(self._gone) or bool(self._struck)
        watched = self.watching
        for worker in sorted(self._view.dead & watched):
            beat = self._view.beat(worker)
            if beat is None:
                continue
            try:
                reaped = await self._table.reap_worker(worker, beat)
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("worker.reap_failed", dead_worker=worker, error=str(exc), code=exc.code)
                continue
            if reaped:
                self._log.info("worker.reaped", dead_worker=worker, heartbeat=beat)
                self._struck.add(worker)
                moved = True
        doubting = self._view.doubting & watched
        doubts_changed = doubting ^ (self._doubting & watched)
        if moved or doubts_changed:
            struck = self._struck | self._riders
            # Cleared before the move, not after: a recovery announced while it is under way (by
            # another task) may not be in it, and is kept for the next one.
            announced, gone = self.announce, self._gone
            self.announce, self._gone = False, set()
            about = struck | gone | doubts_changed | ({self._table.worker_id} if announced else set())
            try:
                await self._table.members_changed(not_leaving=struck, about=about)
            except BaseException:
                self.announce |= announced
                self._gone |= gone
                raise
            self._struck -= struck
            self._riders -= struck
        self._doubting = doubting

    def next_death_at(self) -> float | None:
        """When the first watched worker would turn dead if it does not beat before."""
        return self._view.next_death_at(self.watching)
