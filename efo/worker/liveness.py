"""Liveness: one heartbeat row per worker, and whether this worker may still trust its leases.

Others take a worker's leases ``lease.failover_s`` after they last saw its heartbeat counter
change. So a worker trusts its own leases for ``failover_s`` minus one heartbeat interval after
its last heartbeat that landed (counted from when it was sent)::

    UNPROVEN ──first heartbeat landed──▶ TRUSTED ◀──a heartbeat landed── IN_DOUBT
                                          ▲  └──none landed for the validity──▶┘ │
                                          │                                      │ one written in
                                          └── one written after it landed ── RECOVERING ◀┘ doubt landed

Until its first heartbeat lands a worker claims nothing (others would see a lease owner without a
heartbeat row, and take its leases). Past the validity it is **in doubt**: ``on_expired`` drops
every lease (stop reading, stop checkpointing), and once a heartbeat lands again ``on_recovered``
lets the lease cycle claim again.

Heartbeats go out every ``heartbeat_interval_s`` whatever the last one's latency (each waited for
at most the validity, a few under way at once): a DynamoDB that answers in 5 s leaves every worker
trusted, where waiting for each answer before the next interval put them in doubt. A heartbeat
written in doubt says so (``in_doubt``), so the others take this worker's leases at once rather
than watching a counter that moves while nobody reads its shards (race d of issue 37); the first
goes out the moment the doubt begins (an older heartbeat's late answer may end it before the next
on the schedule would, and the leases are dropped already). So a DynamoDB, or a loop, slow enough
that each answer comes after the last one's validity ran out (over ``failover_s`` minus two
intervals: 6 s at the defaults) leaves the worker in doubt, saying so, and the others take its
leases: it drops them at every lapse anyway, and a row that said it was well left them unread. Such a
heartbeat landing proves DynamoDB answers again, but the row still says "in doubt": the worker is
RECOVERING, writes the next heartbeat at once, and claims again only once that one (which does not
say it) has landed, so that nobody takes back from it what it claims.

The heartbeat goes out on a DynamoDB client of its own (its own connections), with its own
deadline: no amount of lease or checkpoint traffic delays it.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import Callable
from typing import Protocol

import structlog

from efo.clock import SYSTEM_CLOCK, Clock, Timer
from efo.config import LeaseSettings
from efo.errors import EfoError

log = structlog.get_logger("efo.worker.liveness")


class Trust(enum.Enum):
    UNPROVEN = "unproven"  # no heartbeat has landed yet
    TRUSTED = "trusted"  # the last one landed within the validity
    IN_DOUBT = "in_doubt"  # none landed for the validity: others may hold these leases by now
    RECOVERING = "recovering"  # one written in doubt landed; until the next lands, the row says "in doubt"


TRANSITIONS: dict[Trust, frozenset[Trust]] = {
    Trust.UNPROVEN: frozenset({Trust.TRUSTED}),
    Trust.TRUSTED: frozenset({Trust.IN_DOUBT}),
    Trust.IN_DOUBT: frozenset({Trust.TRUSTED, Trust.RECOVERING}),
    Trust.RECOVERING: frozenset({Trust.TRUSTED, Trust.IN_DOUBT}),
}


class HeartbeatWriter(Protocol):
    worker_id: str

    async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
        """True if it landed; False if a newer heartbeat of this worker had landed already."""
        ...


class LeaseTrust(Protocol):
    """What the parts that claim and write leases ask of :class:`Liveness`."""

    @property
    def valid(self) -> bool:
        """It may write to the leases it holds now."""
        ...

    @property
    def in_doubt(self) -> bool:
        """It may not claim or hold leases now."""
        ...


class Liveness:
    def __init__(
        self,
        writer: HeartbeatWriter,
        settings: LeaseSettings,
        *,
        on_expired: Callable[[], None],
        on_recovered: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._writer = writer
        self._settings = settings
        self._on_expired = on_expired
        self._on_recovered = on_recovered
        self._clock = clock
        self._deadline: Timer | None = None
        self._wake = asyncio.Event()  # run(): a heartbeat was asked for at once, or one under way ended
        self._asked = False  # one was asked for at once and has not gone out yet
        self.landed_at: float | None = None  # when the last heartbeat that landed was sent
        self._sent = 0  # heartbeats sent, in the order of their counters in the row
        self._last_in_doubt = 0  # the number of the last one written in doubt (0: none)
        self.leaving = False  # stopping: every heartbeat from now says so
        self.trust = Trust.UNPROVEN
        self._log = log.bind(worker_id=writer.worker_id)

    @property
    def validity_s(self) -> float:
        """How long after its last heartbeat that landed this worker still trusts its leases."""
        return self._settings.failover_s - self._settings.heartbeat_interval_s

    @property
    def in_doubt(self) -> bool:
        """This worker may not claim or hold leases now: no heartbeat landed yet, or not lately, or
        its row still says it is in doubt."""
        return self.trust is not Trust.TRUSTED

    @property
    def valid(self) -> bool:
        """It may write to the leases it holds: trusted, and within the validity of the last heartbeat."""
        return (
            self.trust is Trust.TRUSTED
            and self.landed_at is not None
            and self._clock.now() - self.landed_at < self.validity_s
        )

    def _enter(self, trust: Trust) -> None:
        assert trust in TRANSITIONS[self.trust], f"{self.trust.name} -> {trust.name}"
        self.trust = trust

    async def leave(self) -> bool:
        """This worker is stopping: every heartbeat from now says so, and one goes out now (True if
        it landed), so the others watch its part of the ring while it reads on."""
        self.leaving = True
        return await self.beat()

    async def beat(self) -> bool:
        """One heartbeat, waited for at most the lease validity; True if it landed."""
        sent_at = self._clock.now()
        written_in_doubt = self.trust is Trust.IN_DOUBT
        self._sent += 1
        number = self._sent
        if written_in_doubt:
            self._last_in_doubt = number
        try:
            # A write that lands late still counts (from when it was sent); past the validity it is moot.
            async with self._clock.timeout(self.validity_s):
                if not await self._writer.heartbeat(in_doubt=written_in_doubt, leaving=self.leaving):
                    return False  # a newer one landed first: this one proves nothing more
        except TimeoutError:
            self._log.warning("lease.heartbeat_failed", error=f"no answer within {self.validity_s:g} s")
            return False
        except EfoError as exc:
            if not exc.retriable:
                raise
            self._log.warning("lease.heartbeat_failed", error=str(exc), code=exc.code)
            return False
        self.landed(sent_at, number, written_in_doubt=written_in_doubt)
        return True

    async def run(self, before_beat: Callable[[], None] = lambda: None) -> None:
        """A heartbeat every ``heartbeat_interval_s`` until cancelled, on a fixed schedule: the next
        goes out on time while the last is still under way (at most as many as fit in the validity).
        One asked for at once (the doubt begins, or a recovery's) goes out off the schedule as soon as
        one under way leaves room for it (a beat the schedule sends meanwhile finds no room).
        ``before_beat`` runs before each (the coordinator's: has a batch stalled in the sink); what it
        raises ends the run. Given here, not to the constructor: the checkpointer that answers it is
        built after this part, with this part as its :class:`LeaseTrust`."""
        interval_s = self._settings.heartbeat_interval_s
        most = max(1, math.ceil(self.validity_s / interval_s))
        under_way: set[asyncio.Task[bool]] = set()

        def ended(task: asyncio.Task[bool]) -> None:
            under_way.discard(task)
            if self._asked:
                self._wake.set()  # a beat asked for at once waited for this room

        async with asyncio.TaskGroup() as beats:
            due_at = self._clock.now() + interval_s
            while True:
                try:
                    async with self._clock.timeout(max(0.0, due_at - self._clock.now())):
                        await self._wake.wait()  # one asked for at once (in doubt, recovering), or room for it
                except TimeoutError:
                    pass
                self._wake.clear()
                now = self._clock.now()
                if now >= due_at:  # the schedule's
                    due_at += interval_s
                    if due_at < now:  # woke late (a busy loop, a pause): on from now
                        due_at = now + interval_s
                elif not self._asked:
                    continue
                before_beat()
                if len(under_way) < most:  # else the schedule's waits for the next slot, one asked for for room
                    self._asked = False
                    task = beats.create_task(self.beat(), name="heartbeat-write")
                    under_way.add(task)
                    task.add_done_callback(ended)

    def _ask(self) -> None:
        """A heartbeat now, besides the schedule's (as soon as one under way leaves room for it)."""
        self._asked = True
        self._wake.set()

    def landed(self, sent_at: float, number: int, *, written_in_doubt: bool = False) -> None:
        """Heartbeat ``number``, sent at ``sent_at``, landed. Only the newest one sent counts, and only
        while within the validity (it is moot after that). One not written in doubt makes the worker
        trusted only if it was sent after the last one written in doubt: an older one may land before
        that one, which would then land on top of it (its counter is higher) and say "in doubt" while
        the worker claims and reads (found by the simulation, seed 104 of 64 x 8 with every fault)."""
        if (self.landed_at is not None and sent_at < self.landed_at) or self._clock.now() >= sent_at + self.validity_s:
            return
        if not written_in_doubt and number < self._last_in_doubt:
            return  # proves DynamoDB answers, not that the row no longer says "in doubt"
        self.landed_at = sent_at
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._clock.call_later(sent_at + self.validity_s - self._clock.now(), self._expire)
        previous = self.trust
        if written_in_doubt:
            if previous is Trust.IN_DOUBT:
                self._enter(Trust.RECOVERING)
                self._ask()  # the next one, which does not say "in doubt", at once
            return
        if previous is not Trust.TRUSTED:
            self._enter(Trust.TRUSTED)
        if previous in (Trust.IN_DOUBT, Trust.RECOVERING):
            self._log.info("lease.heartbeat_recovered")
            self._on_recovered()

    def _expire(self) -> None:
        """No heartbeat landed for the lease validity: others may own these shards by now."""
        self._deadline = None
        self._enter(Trust.IN_DOUBT)
        self._log.warning("lease.in_doubt", validity_s=self.validity_s)
        self._on_expired()
        # Say so at once, not at the next beat on the schedule: an older heartbeat's late answer may
        # make this worker trusted again before that one goes out (each answer read just after the
        # validity, on a loop running late), and then no row ever says "in doubt" while the others
        # watch a counter that moves and nobody reads the shards just dropped.
        self._ask()

    def close(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
