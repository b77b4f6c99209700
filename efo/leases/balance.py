"""How many shards each worker reads, decided by each worker on its own from one read of the table.

Of the ``n`` shards that can be read now (not finished, parents finished) and the ``w`` live
workers, each worker's share is ``floor(n / w)``, one more for ``n mod w`` workers in name order
(from the ``rank_offset``-th on, around: several streams deal their extras in turn): every worker
computes every share from the same table, so they agree without talking.
In one cycle a worker:

1. **claims** free leases (unowned, or held by a dead worker) up to its share (and
   ``max_leases_per_worker``), and beyond it up to ``ceil(n / w)`` only when more is free than all
   the shares still missing; a free lease another live worker asked for is left to that worker;
   each worker takes the free leases from its own place in the list (after what the workers before
   it in name order are missing), so that workers claiming at once (a start, a takeover) take
   disjoint ones;
2. **sheds** what it holds above its share when that is above ``ceil(n / w)`` or another worker
   holds less than ``floor(n / w)``, handing those leases over gracefully (in-flight records
   committed, checkpoint written, lease released) so that the worker short of its share claims
   them: this is how a worker that joins gets its share within a few cycles;
3. **asks** for a lease (a steal is a request, not a grab) when it has held less than its share
   for a while (the caller's ``may_ask``), nothing is free, and the worker most above its own
   share (then the most loaded) holds at least two more than it: at most ``max_steals_per_cycle``
   requests open, from that worker only. A worker that holds more than its share sheds on its
   own, so this is the fallback for one that does not (asking at once would race that shedding
   and move more than needed). An owner at or below its share (:func:`target`) that handed a
   lease over shortly before declines a request instead (:func:`answer_requests`): written from
   a read older than that handover, it would move one lease too many.

A worker that is stopping (``leaving``: its heartbeat or the version row says so) counts no share:
the others' shares are those of the fleet without it, so what it releases goes to the workers
short of theirs (in a rolling deploy, the new worker that started as its stop began) and nothing
else moves; its leases stay its own until it releases them, and nobody asks while they cover
what the others miss, nor is a request of its honoured.

Hysteresis: nothing moves while the spread is at most one; a lease that changed owner in the
last few cycles is neither shed nor asked for again (no ping-pong); a worker never asks itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from efo.leases.model import Lease

#: Spare free leases named for each claim: a worker whose claim and first spare were both taken by
#: others whose reads were newer still claims in the same cycle (simulation seed 39 of 64 x 8).
SPARES_PER_CLAIM = 2


@dataclass(frozen=True)
class Plan:
    claim: list[Lease] = field(default_factory=list)
    shed: list[str] = field(default_factory=list)
    ask: list[Lease] = field(default_factory=list)
    target: int = 0
    short: bool = False  # below its share with nothing free to claim: others should shed to it
    #: The free leases next in this worker's order after its claims (SPARES_PER_CLAIM for each):
    #: claimed in the same cycle in place of those another worker claimed first (workers whose reads
    #: differ by a claim collide, and so may their spares).
    spare: list[Lease] = field(default_factory=list)
    #: The other workers with a share that hold fewer leases than it (the decision watches for one
    #: that does not claim what is free: :data:`efo.worker.decision.LAG_CYCLES`).
    short_workers: frozenset[str] = frozenset()


def plan(
    me: str,
    readable: Iterable[Lease],
    live: Iterable[str],
    *,
    moved_recently: AbstractSet[str] = frozenset(),
    reserved_for_others: AbstractSet[str] = frozenset(),
    stranded: AbstractSet[str] = frozenset(),
    asked: int = 0,
    may_ask: bool = True,
    max_leases: int | None = None,
    max_steals: int = 1,
    rank_offset: int = 0,
    exact: bool = False,
    room: int | None = None,
    stale_free: AbstractSet[str] = frozenset(),
    shed_for_short: bool = True,
    barred: AbstractSet[str] = frozenset(),
    leaving: AbstractSet[str] = frozenset(),
) -> Plan:
    """This worker's moves for one cycle. ``readable``: the leases that can be read now; ``live``:
    the workers whose heartbeat is alive (this one included or not); ``reserved_for_others``: free
    leases another live worker asked for, still fresh; ``stranded``: free leases that are still this
    worker's in the table (taken back first: no move); ``asked``: this worker's requests still open;
    ``may_ask``: this worker has been short for long enough that the others had their chance to shed;
    ``max_leases``: at most this many here (None: no limit); ``rank_offset``: the extra shards go to
    the workers from this rank on, in name order and around (:mod:`efo.worker.streams`); ``exact``: a
    spread of one moves too when the extra is not where the offset puts it (several streams: spreads
    of one in the same direction add up over the streams); ``room``: at most this many here whatever
    the share (what ``max_leases`` leaves over this worker's other streams; None: no other limit);
    ``stale_free``: free leases nobody claimed for several cycles (workers that disagree on the
    shares each leave them to another, or a short worker that cannot claim): claimable up to the
    ceiling, so no shard stays unread, and never paid for by shedding another in the same cycle;
    ``shed_for_short``: hand over what is above the share to a worker short of its own (False for a
    while after this worker took stale leases: the short worker did not claim what was free);
    ``barred``: workers that declined a request of this one lately, not asked again for now;
    ``leaving``: live workers that are stopping: no share is theirs (the others count theirs without
    them, so that what they release is claimed at once), their leases are not free until released,
    nothing is asked of them and nothing kept for what they asked; and while what they hold covers
    what the others miss, nobody asks (it is on its way: a request would move a lease twice, from
    its owner to the asker, and one of the released ones back to that owner)."""
    return plan_by_owner(
        me,
        by_owner(readable),
        live,
        moved_recently=moved_recently,
        reserved_for_others=reserved_for_others,
        stranded=stranded,
        asked=asked,
        may_ask=may_ask,
        max_leases=max_leases,
        max_steals=max_steals,
        rank_offset=rank_offset,
        exact=exact,
        room=room,
        stale_free=stale_free,
        shed_for_short=shed_for_short,
        barred=barred,
        leaving=leaving,
    )


def plan_by_owner(
    me: str,
    readable: Mapping[str | None, Mapping[str, Lease]],
    live: Iterable[str],
    *,
    moved_recently: AbstractSet[str] = frozenset(),
    reserved_for_others: AbstractSet[str] = frozenset(),
    stranded: AbstractSet[str] = frozenset(),
    asked: int = 0,
    may_ask: bool = True,
    max_leases: int | None = None,
    max_steals: int = 1,
    rank_offset: int = 0,
    exact: bool = False,
    room: int | None = None,
    stale_free: AbstractSet[str] = frozenset(),
    shed_for_short: bool = True,
    barred: AbstractSet[str] = frozenset(),
    leaving: AbstractSet[str] = frozenset(),
    first_of: AbstractSet[str] = frozenset(),
) -> Plan:
    """:func:`plan` of the readable leases grouped by owner (owner, None for nobody -> shard -> lease,
    as :func:`by_owner` groups them or :class:`efo.leases.readable.ReadableLeases` keeps them): what it
    costs grows with the free leases and this worker's, not with every lease. ``first_of``: free
    leases to claim before the others (efo.worker.decision's lag: the dead workers')."""
    alive = set(live) | {me}
    workers = sorted((alive - set(leaving)) | {me})
    count, width = sum(len(leases) for leases in readable.values()), len(workers)
    floor, extra = divmod(count, width)
    ceiling = floor + (1 if extra else 0)

    members = set(workers)
    shares = {worker: _share_of_rank(at, width, count, rank_offset, max_leases) for at, worker in enumerate(workers)}

    def share(worker: str) -> int:
        return shares[worker]

    load = Counter({worker: len(readable.get(worker, {})) for worker in workers})
    mine, target = load[me], share(me) if room is None else min(share(me), room)

    def _asked_at_share(asker: str | None) -> bool:
        """A live asker already at its share may not claim what it asked for (its ceiling, its
        limit), nor one that is stopping: the lease is not kept for it."""
        if asker in alive and asker not in members:
            return True
        return asker in members and load[asker] >= share(asker)

    free = [
        lease
        for owner, leases in readable.items()
        if owner not in alive
        for lease in leases.values()
        if lease.wanted_by == me or lease.shard_id not in reserved_for_others or _asked_at_share(lease.wanted_by)
    ]
    # What this worker asked for or still holds in the table first; then from its own place in the
    # list (its rank's share of the way along), so that workers claiming at once do not all race
    # for the same leases.
    first = sorted(
        (lease for lease in free if lease.wanted_by == me or lease.shard_id in stranded),
        key=lambda lease: (lease.wanted_by != me, lease.shard_id),
    )
    taken_first = {lease.shard_id for lease in first}
    preferred = sorted(
        (lease for lease in free if lease.shard_id in first_of and lease.shard_id not in taken_first),
        key=lambda lease: lease.shard_id,
    )
    taken_first |= {lease.shard_id for lease in preferred}
    rest = sorted((lease for lease in free if lease.shard_id not in taken_first), key=lambda lease: lease.shard_id)
    # Each worker's slice of the free leases (of the preferred ones, then of the rest) starts after
    # what the workers before it in name order are missing: workers that read the same table claim
    # disjoint leases in the same cycle.
    short_of = [max(0, share(worker) - load[worker]) for worker in workers]
    before_me = sum(short_of[: workers.index(me)])
    free = first + _from(preferred, before_me) + _from(rest, before_me)
    missing = sum(short_of)
    most = min(ceiling, max_leases) if max_leases is not None else ceiling
    if room is not None:
        most = min(most, room)
    cap = target if len(free) <= missing else max(target, most)
    if room is not None:
        cap = min(cap, room)
    claim = free[: max(0, cap - mine)]
    within_cap = len(claim)
    # What it asked for and is free now (its owner died, or handed it over late) is left to it by
    # every other worker until the request is failover_s old: claimed even at its share, up to the
    # ceiling, or its shard waits that long unread.
    asked_for = [lease for lease in first if lease.wanted_by == me and lease not in claim]
    claim += asked_for[: max(0, most - mine - len(claim))]
    taken = {lease.shard_id for lease in claim}
    spare = [lease for lease in free if lease.shard_id not in taken][: SPARES_PER_CLAIM * within_cap]
    # Stale leases: up to the ceiling whatever the shares say, and only those above the share.
    stale = [lease for lease in free if lease.shard_id in stale_free and lease.shard_id not in taken]
    stale = stale[: max(0, most - mine - len(claim))]
    claim += stale
    held = mine + len(claim)

    shed: list[str] = []
    short = (
        shed_for_short
        and not stale
        and any(
            load[worker] < (share(worker) if exact else min(floor, share(worker))) for worker in workers if worker != me
        )
    )
    if held > target and (held > ceiling or short or (room is not None and held > room)):
        movable = [shard_id for shard_id in readable.get(me, {}) if shard_id not in moved_recently]
        shed = sorted(movable, reverse=True)[: held - target]

    ask: list[Lease] = []
    room = target - held
    short = not claim and not shed and room > 0
    # What stopping workers still hold comes free as they stop: while it and what is free (kept for
    # another's request, say) cover what the workers miss, nobody asks (a request would move a lease
    # twice: to the asker, and a released one back to the worker it was taken from).
    releasing = any(readable.get(worker) for worker in alive - members)
    on_its_way = releasing and count - sum(load.values()) >= missing
    if short and may_ask and asked < max_steals and not on_its_way:
        others = [worker for worker in workers if worker != me and worker not in barred]
        if barred:  # a decline: what was shed is on its way here, so only a worker above its share is asked
            others = [worker for worker in others if load[worker] > share(worker)]
        if others:
            # The most above its own share (the one that will hand over), then the most loaded.
            donor = max(others, key=lambda worker: (load[worker] - share(worker), load[worker], worker))
            if load[donor] - mine >= 2:
                candidates = sorted(
                    (
                        lease
                        for lease in readable.get(donor, {}).values()
                        if lease.wanted_by is None and lease.shard_id not in moved_recently
                    ),
                    key=lambda lease: lease.shard_id,
                )
                ask = candidates[: min(room, max_steals - asked)]
    taken = {lease.shard_id for lease in claim}  # the stale ones too
    return Plan(
        claim=claim,
        shed=shed,
        ask=ask,
        target=target,
        short=short,
        spare=[s for s in spare if s.shard_id not in taken],
        short_workers=frozenset(worker for worker, gap in zip(workers, short_of, strict=True) if gap and worker != me),
    )


def _from(leases: list[Lease], at: int) -> list[Lease]:
    """``leases`` from the ``at``-th on, around."""
    start = at % len(leases) if leases else 0
    return leases[start:] + leases[:start]


def by_owner(leases: Iterable[Lease]) -> dict[str | None, dict[str, Lease]]:
    """The leases grouped by owner (None: nobody), for :func:`plan_by_owner`."""
    grouped: dict[str | None, dict[str, Lease]] = {}
    for lease in leases:
        grouped.setdefault(lease.owner, {})[lease.shard_id] = lease
    return grouped


def target(
    me: str,
    readable: int,
    live: Iterable[str],
    *,
    max_leases: int | None = None,
    rank_offset: int = 0,
    room: int | None = None,
    leaving: AbstractSet[str] = frozenset(),
) -> int:
    """How many of the ``readable`` shards this worker should hold: :func:`plan`'s ``target`` for
    the same arguments, worked out before the cycle's moves (whether to honour a handover request)."""
    workers = sorted((set(live) - set(leaving)) | {me})
    share = _share(me, workers, readable, rank_offset, max_leases)
    return share if room is None else min(share, room)


def answer_requests(
    requested: Sequence[str],
    *,
    held: int,
    target: int,
    gave_lately: bool,
    from_leaving: AbstractSet[str] = frozenset(),
) -> tuple[list[str], list[str]]:
    """Other workers' handover requests for leases held here (``held`` of them, ``target`` its
    share): which to honour and which to decline, in order. Honoured while this worker holds more
    than its share, or when it has given nothing over lately (``gave_lately``: within
    ``failover_s``, shed or asked); declined otherwise. A request that comes after this worker
    handed leases over was written from an older read of the table (its asker will claim what was
    shed); any other is honoured even at the share, since workers that disagree on the shares
    (their lists of streams differ for a while) have no other way to move a lease. Each one
    honoured counts as giving: two at once do not take this worker below its share. A request whose
    asker is stopping (``from_leaving``) is declined: it would claim nothing, and the lease would
    move twice. (One whose asker is not live at all is answered as any other: a worker that does
    not see the asker's row yet must not turn it away.)"""
    honour: list[str] = []
    decline: list[str] = []
    for shard_id in requested:
        if shard_id in from_leaving:
            decline.append(shard_id)
        elif held > target or not gave_lately:
            honour.append(shard_id)
            held -= 1
            gave_lately = True
        else:
            decline.append(shard_id)
    return honour, decline


def _share(worker: str, workers: list[str], count: int, rank_offset: int, max_leases: int | None) -> int:
    """``worker``'s share of ``count`` shards among ``workers`` (sorted): the floor, one more for the
    ``count mod len(workers)`` workers from rank ``rank_offset`` on (around), at most ``max_leases``."""
    return _share_of_rank(workers.index(worker), len(workers), count, rank_offset, max_leases)


def _share_of_rank(rank: int, width: int, count: int, rank_offset: int, max_leases: int | None) -> int:
    """:func:`_share` of the worker at ``rank`` (0-based, in name order) of ``width`` workers."""
    floor, extra = divmod(count, width)
    base = floor + (1 if (rank - rank_offset) % width < extra else 0)
    return base if max_leases is None else min(base, max_leases)
