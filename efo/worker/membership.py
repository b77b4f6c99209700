"""Who is alive, read in a number of rows that grows with the workers, not with their square.

Every worker writes its heartbeat row every ``heartbeat_interval_s``. Reading every row every cycle,
as every worker did, costs W rows a worker a second: W² for the fleet, about 4,000 read units a
second on one partition key at 256 workers. Instead:

- **The membership counter.** The version row, which every cycle reads anyway, carries a counter
  (``members``) that moves whenever who is alive changes: a worker that starts (once its first
  heartbeat landed), stops (once its row is removed), recovers from doubt, or is found dead or in
  doubt by those who watch it. When it moved, a cycle reads every heartbeat row (one Query).
- **Watching.** Each cycle reads the rows of the :data:`WATCHED` workers after this one, in name
  order around the ring (so each worker is watched by the ones before it): a few GetItems,
  eventually consistent. A watched worker whose counter did not change for ``failover_s`` is dead:
  its row is deleted (if still as read: :meth:`~efo.leases.table.LeaseTable.reap_worker`) and the
  counter moved, so every worker reads the rows again, finds none for it, and takes its leases. One
  whose row says it is in doubt, or no longer, moves the counter too, and so does a watcher that
  finds a watched row gone while the counter stays where it was (a stop whose delete landed but
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
and every deletion is conditional on the counter read. Reading every row is strongly consistent: it
follows a change of who is alive, and a stale answer would show a reaped row, alive again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Protocol

import structlog

from efo.clock import Clock
from efo.leases.model import WorkerRow
from efo.leases.view import TableView
from efo.observability import METRICS

log = structlog.get_logger("efo.worker.membership")

#: How many workers after it in name order each worker reads every cycle.
WATCHED = 2
#: Every heartbeat row is read again about this often (strongly consistent: a few hundred bytes a
#: worker), from half of it to all of it.
ALL_ROWS_EVERY_S = 60.0
JITTER_FROM = 0.5


class HeartbeatRows(Protocol):
    """What membership uses of the lease table (:class:`efo.leases.table.LeaseTable`)."""

    worker_id: str

    async def read_workers(self, *, consistent: bool = False) -> dict[str, WorkerRow]: ...
    async def read_some_workers(self, worker_ids: Iterable[str]) -> dict[str, WorkerRow | None]: ...
    async def read_worker(self, worker_id: str) -> WorkerRow | None: ...
    async def reap_worker(self, worker_id: str, heartbeat: int) -> bool: ...
    async def members_changed(self, *, not_leaving: Iterable[str] = ()) -> None: ...


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
        self._members: int | None = None  # the counter as of the last read of every row
        self._full_due = 0.0
        self._doubting: set[str] = set()  # watched workers whose row said "in doubt", at the last read
        self._ring: set[str] = set()  # the WATCHED after this one around the ring, at the last read
        self._watched_until: dict[str, float] = {}  # no longer on the ring's part: watched until then
        self.watching: set[str] = set()  # the rows each cycle reads: the ring's part, and those still watched
        self.rows: dict[str, WorkerRow] = {}  # every row as last read (the watched ones since)
        self.announce = True  # this worker's own change to announce (its start, its recovery)
        #: A watched row found gone by a read of the watched ones: its worker stopped (or was reaped)
        #: and the counter may not have moved (its delete landed, the answer was lost). Announced if
        #: the counter has still not moved by the next cycle (it usually follows the delete at once).
        self._gone_seen = False
        self._gone = False
        self._gone_workers: set[str] = set()  # whose rows those were
        #: Names to strike off the version row's stopping ones at the next move of the counter, kept
        #: until one lands: its own at its start (a stop of its own before may have left its name),
        #: the workers it reaped or found gone, and its own again if it finds itself named while not
        #: stopping (a stop's write that landed late; see :meth:`strike`).
        self._struck: set[str] = {table.worker_id}
        self._log = log.bind(worker_id=table.worker_id)

    async def read(self, members: int) -> None:
        """The heartbeat rows this cycle needs: every one when the counter moved (or the safety net is
        due), else the watched ones."""
        issued_at = self._clock.now()
        if members != self._members or issued_at >= self._full_due:
            self._reads.inc()
            rows = await self._table.read_workers(consistent=True)  # after a reap: that row is gone
            answered_at = self._clock.now()
            self.rows = dict(rows)
            self._view.saw_workers(rows, issued_at=issued_at, answered_at=answered_at, complete=True)
            self._members = members
            self._gone = self._gone_seen = False  # the counter moved: every worker reads every row
            self._gone_workers.clear()
            self._full_due = issued_at + ALL_ROWS_EVERY_S * (JITTER_FROM + (1 - JITTER_FROM) * self._rng())
            self._rewatch()
            return
        asked = sorted(self.watching)
        self._reads.inc(len(asked))
        watched = await self._table.read_some_workers(asked)
        answered_at = self._clock.now()
        self._gone, self._gone_seen = self._gone_seen, False
        for worker, row in watched.items():
            if row is None:
                if self.rows.pop(worker, None) is not None:
                    self._gone_seen = True
                    self._gone_workers.add(worker)
            else:
                self.rows[worker] = row
        self._view.saw_workers(watched, issued_at=issued_at, answered_at=answered_at, complete=False)
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

    def strike(self, worker: str) -> None:
        """``worker`` is not stopping though the version row names it: struck off at the next move of
        the counter (this cycle's :meth:`act`)."""
        self._struck.add(worker)

    async def act(self) -> None:
        """Announce this worker's own change; reap the watched workers found dead; tell of those found
        in doubt, or no longer. Each moves the membership counter, and strikes the names due off the
        version row's stopping ones."""
        moved = bool(self._struck)
        if self.announce or self._gone:
            moved = True
            self.announce = self._gone = False
            self._struck |= self._gone_workers
            self._gone_workers.clear()
        watched = self.watching
        for worker in sorted(self._view.dead & watched):
            beat = self._view.beat(worker)
            if beat is not None and await self._table.reap_worker(worker, beat):
                self._log.info("worker.reaped", dead_worker=worker, heartbeat=beat)
                moved = True
                self._struck.add(worker)
        doubting = self._view.doubting & watched
        if doubting != self._doubting & watched:
            moved = True
        self._doubting = doubting
        if moved:
            struck = set(self._struck)
            try:
                await self._table.members_changed(not_leaving=struck)
            except BaseException:
                self.announce = True  # tried again at the next cycle
                raise
            self._struck -= struck

    def next_death_at(self) -> float | None:
        """When the first watched worker would turn dead if it does not beat before."""
        return self._view.next_death_at(self.watching)
