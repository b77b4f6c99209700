"""One lease cycle's moves, decided from what this worker sees and remembers, at a moment of its clock:
``decide(seen, memory, now) -> (plan, memory)``. No table, no clock, no await: the lease cycle
(:class:`efo.worker.cycle.LeaseCycle`) gathers what it sees, calls :func:`decide`, and performs the
plan (claims, handovers, requests). :func:`efo.leases.balance.plan_by_owner` decides the shares;
this adds what spans cycles:

- a readable lease without a live owner for :data:`STALE_FREE_CYCLES` cycles is **stale**: any
  worker with room claims it up to the ceiling, whatever the shares say (workers that disagree on
  who is alive, or on the shares, would each leave it to another);
- after such a claim, this worker hands nothing over to short workers for :data:`QUIET_CYCLES`
  cycles (the short worker did not claim what was free; moving it back and forth would churn);
- a worker below its share with nothing free **asks** only once it has been below it for
  :data:`ASK_AFTER_CYCLES` cycles (time for the others to shed on their own; a lease it asked for
  and claimed does not start that count again), and not the workers that declined a request of its
  own lately (``declined_by``): meanwhile only a worker above its share (what was shed is on its way);
- a live worker that holds leases, below its share (or below it in the shares without the workers
  that lag already: one after another), that :data:`LAG_CYCLES` on holds no more while
  a dead worker's lease free then is free still (it claims nothing: it died too and is not found
  yet, or its claims fail) **lags**: this worker claims the dead workers' leases as the shares
  would be without it (no more than those shares would claim; nothing else beyond its own share;
  only what those shares would shed too is shed), until it claims or for about ``failover_s``, so
  no survivor stops at a ceiling that counts a dead worker's share. Not where several streams deal
  the shares from different offsets (the workers may disagree on them), and not from a graceful
  stop's releases read before they landed (``stopped``).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from efo.leases import balance
from efo.leases.model import Lease

#: A lease that changed owner this many lease cycles ago or less is not moved again (no ping-pong).
SETTLE_CYCLES = 10
#: A worker short of its share asks for a lease only after this many cycles: time for the others to
#: see its heartbeat and shed on their own (asking at once races that, and more moves than needed).
ASK_AFTER_CYCLES = 3
#: A readable lease nobody claimed for this many cycles is claimable up to the ceiling by any worker
#: with room, whatever the shares say: workers that disagree on them (their lists of streams differ
#: during a rolling restart) would otherwise each leave it to another. Three: a rolling deploy that
#: replaces a worker every second or two changes the shares faster than they settle, and a shard left
#: so must be read again within 5 s (issue 37's goal; five cycles, and its claim, took longer).
STALE_FREE_CYCLES = 3
#: A live worker holding leases, below its share while a dead worker's leases are free, lags when this
#: many cycles on it holds no more and one of those leases is free still, until it claims or
#: ``failover_s`` and two cycles have passed (if it died, it was found dead and reaped by then: its
#: last heartbeat came before it was first seen so). Two deaths a few seconds apart: when the first
#: is found the second still counts as alive, and its part of the first's leases would stay free,
#: every survivor at the ceiling, until it too is found dead: a shard of the first unread 12.5-13 s
#: (tests/sim/test_deaths.py). One cycle: a live worker claims what it sees free at its next cycle;
#: one that learned of the death later and lost the race gets that lease back when the lag ends.
LAG_CYCLES = 1
#: After this worker took stale leases (a short worker did not claim what was free), it hands
#: nothing over to short workers for this many cycles: at most one such move a minute, no churn.
QUIET_CYCLES = 60


@dataclass(frozen=True, slots=True)
class Seen:
    """What one cycle sees: the readable leases by owner as the plan is to see them (a lease being
    handed over is its asker's, or free), and this worker's circumstances."""

    me: str
    readable: Mapping[str | None, Mapping[str, Lease]]
    live: AbstractSet[str]
    interval_s: float  # lease.sync_interval_s: what a cycle is, in seconds
    stranded: AbstractSet[str] = frozenset()  # this worker's in the table, not running here
    moved_recently: AbstractSet[str] = frozenset()  # changed hands lately, or draining here
    reserved_for_others: AbstractSet[str] = frozenset()
    asked: int = 0  # this worker's requests still open
    max_leases: int | None = None
    max_steals: int = 1
    rank_offset: int = 0
    exact: bool = False
    room: int | None = None
    leaving: AbstractSet[str] = frozenset()  # live, stopping: no share of theirs (efo.leases.balance)
    failover_s: float = 10.0  # lease.failover_s: a worker that lags is found dead within it
    stopped: AbstractSet[str] = frozenset()  # stopped lately: what a read shows them holding is released
    #: This worker reads several streams: the workers may deal the shares from different offsets for
    #: a while (their lists of streams differ during a rolling restart), so none is judged to lag.
    several_streams: bool = False


@dataclass(frozen=True, slots=True)
class Memory:
    """What the decision keeps from one cycle to the next, on this worker's clock (seconds)."""

    free_since: Mapping[str, float] = field(default_factory=dict)  # readable, no live owner: first seen then
    short_since: float | None = None  # below its share with nothing free: since then
    quiet_until: float = 0.0  # no handing over to short workers before then
    declined_by: Mapping[str, float] = field(default_factory=dict)  # worker -> not asked again before then
    lags: Mapping[str, Lag] = field(default_factory=dict)  # workers seen below their share, that may lag


@dataclass(frozen=True, slots=True)
class Lag:
    """A worker first seen below its share (or below it in the shares without those that lag) at
    ``since`` (on this worker's clock), holding ``held``,
    while the dead workers' leases ``free`` were free: it lags (``lags``) if :data:`LAG_CYCLES` on it
    holds no more and one of them is free still."""

    since: float
    held: int
    free: frozenset[str]
    lags: bool = False


def decide(seen: Seen, memory: Memory, now: float) -> tuple[balance.Plan, Memory]:
    """This cycle's moves, and what to remember for the next."""
    live = seen.live
    free_since = {
        shard_id: memory.free_since.get(shard_id, now)
        for owner, leases in seen.readable.items()
        if owner is None or owner not in live
        for shard_id in leases
    }
    stale = {shard_id for shard_id, since in free_since.items() if now - since >= STALE_FREE_CYCLES * seen.interval_s}
    short_for_s = None if memory.short_since is None else now - memory.short_since
    declined_by = {worker: until for worker, until in memory.declined_by.items() if now < until}

    def holding(worker: str) -> int:
        return len(seen.readable.get(worker, {}))

    dead_free = frozenset(  # a dead (or doubting) worker's leases
        shard_id
        for owner, leases in seen.readable.items()
        if owner is not None and owner not in live and owner not in seen.stopped
        for shard_id in leases
    )
    lags: dict[str, Lag] = {}
    given_s = seen.failover_s + 2 * seen.interval_s
    for worker, lag in memory.lags.items():
        if worker not in live or holding(worker) > lag.held or now - lag.since >= given_s:
            continue  # found dead or gone, claimed, or given its time: it counts a share again
        if not lag.lags and now - lag.since >= LAG_CYCLES * seen.interval_s:
            if not lag.free & dead_free:
                continue  # what it could have claimed was taken by others: nothing says it lags
            lag = replace(lag, lags=True)
        lags[worker] = lag
    lagging = {worker for worker, lag in lags.items() if lag.lags}

    def planned(leaving: AbstractSet[str], first_of: AbstractSet[str] = frozenset()) -> balance.Plan:
        return balance.plan_by_owner(
            seen.me,
            seen.readable,
            live,
            moved_recently=seen.moved_recently,
            reserved_for_others=seen.reserved_for_others,
            stranded=seen.stranded,
            asked=seen.asked,
            may_ask=short_for_s is not None and short_for_s >= ASK_AFTER_CYCLES * seen.interval_s,
            max_leases=seen.max_leases,
            max_steals=seen.max_steals,
            rank_offset=seen.rank_offset,
            exact=seen.exact,
            room=seen.room,
            stale_free=stale,
            shed_for_short=now >= memory.quiet_until,
            barred=declined_by.keys(),
            leaving=leaving,
            first_of=first_of,
        )

    plan = planned(seen.leaving)
    short_workers = plan.short_workers
    if lagging:
        # The shares without the workers that lag: only the dead workers' leases are claimed beyond
        # the plan (what else is free is theirs to claim still), never more than those shares would
        # claim (their ceiling, room and limit), and only what they would shed too is shed. Those
        # shares claim the dead workers' first: another free lease before them would take their place.
        wider = planned(seen.leaving | lagging, first_of=dead_free)
        short_workers |= wider.short_workers  # the share a lagging one no longer counts goes to the next
        claimed = {lease.shard_id for lease in plan.claim}
        extra = [lease for lease in wider.claim if lease.shard_id in dead_free and lease.shard_id not in claimed]
        extra = extra[: max(0, len(wider.claim) - len(plan.claim))]
        taken = claimed | {lease.shard_id for lease in extra}
        plan = replace(
            plan,
            claim=plan.claim + extra,
            shed=[sid for sid in plan.shed if sid in wider.shed],
            spare=[lease for lease in plan.spare if lease.shard_id not in taken],
        )
    if dead_free and not seen.several_streams:  # one that holds none may be new, or back from doubt
        for worker in short_workers - lags.keys():
            if holding(worker):
                lags[worker] = Lag(now, holding(worker), dead_free)
    quiet_until = memory.quiet_until
    if any(lease.shard_id in stale for lease in plan.claim):
        quiet_until = now + QUIET_CYCLES * seen.interval_s
    held = len(seen.readable.get(seen.me, {})) + len(plan.claim) - len(plan.shed)
    asked_for = any(lease.wanted_by == seen.me for lease in plan.claim)
    below = plan.short or (asked_for and held < plan.target)  # what it asked for claimed, still below: asks on
    short_since = None if not below else memory.short_since if memory.short_since is not None else now
    return plan, Memory(free_since, short_since, quiet_until, declined_by, lags)
