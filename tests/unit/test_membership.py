"""Membership alone, on the fake clock: which heartbeat rows a worker reads each cycle, and whom it
finds dead; and the moves of the counter that name whom they were about, on the simulated DynamoDB."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

import pytest

from efo.errors import Retriable
from efo.leases.codec import MEMBER_CHANGE_SLOTS
from efo.leases.model import MemberChange, WorkerRow
from efo.leases.table import LeaseTable
from efo.leases.view import TableView
from efo.sim.clock import ManualClock, SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run
from efo.worker.membership import WATCHED, Membership

FAILOVER_S = 10.0
#: Workers enough that a move naming one row is read as that row (a Query of every row costs more),
#: named after the others in these tests: last around the ring.
CROWD = tuple(f"x{i:02d}" for i in range(20))


class Rows:
    """The heartbeat rows and the membership counter, in memory."""

    def __init__(self, worker_id: str, clock: ManualClock) -> None:
        self.worker_id = worker_id
        self.clock = clock
        self.beats: dict[str, int] = {}
        self.members = 0
        self.changes: dict[int, MemberChange] = {}  # each move's counter -> whom it named (the version row's)
        self.named = True  # moves name their workers (False: another worker's move came first each time)
        self.full_reads = 0
        self.named_reads: list[list[str]] = []  # each strongly consistent read of some rows: whose
        self.reaped: list[tuple[str, float]] = []  # (who, when)
        self.struck: list[set[str]] = []  # each move's names struck off the version row's stopping ones
        self.failing = 0  # moves of the counter that fail from now

    def beat(self, worker: str) -> None:
        if worker not in self.beats:
            self._move({worker})  # a start moves the counter
        self.beats[worker] = self.beats.get(worker, 0) + 1

    def _row(self, worker: str) -> WorkerRow | None:
        beat = self.beats.get(worker)
        return None if beat is None else WorkerRow(worker, beat, None)

    async def read_workers(self, *, consistent: bool = False) -> dict[str, WorkerRow]:
        self.full_reads += 1
        return {worker: WorkerRow(worker, beat, None) for worker, beat in self.beats.items()}

    async def read_some_workers(
        self, worker_ids: Iterable[str], *, consistent: bool = False
    ) -> dict[str, WorkerRow | None]:
        if consistent:
            self.named_reads.append(list(worker_ids))
        return {worker: self._row(worker) for worker in worker_ids}

    async def read_worker(self, worker_id: str) -> WorkerRow | None:
        return self._row(worker_id)

    async def reap_worker(self, worker_id: str, heartbeat: int) -> bool:
        if self.beats.get(worker_id) != heartbeat:
            return False
        del self.beats[worker_id]
        self.reaped.append((worker_id, self.clock.now()))
        return True

    async def members_changed(
        self, *, not_leaving: Iterable[str] = (), about: Iterable[str] = (), stopped: bool = False
    ) -> None:
        if self.failing:
            self.failing -= 1
            raise TimeoutError("throttled")
        self._move(set(about), stopped={self.worker_id} if stopped else set())
        self.struck.append(set(not_leaving))

    def _move(self, about: set[str], *, stopped: AbstractSet[str] = frozenset()) -> None:
        self.members += 1
        if self.named:
            self.changes[self.members] = MemberChange(frozenset(about), frozenset(stopped))


def _worker(me: str, others: tuple[str, ...]) -> tuple[ManualClock, Rows, Membership]:
    """``me``'s membership, with ``others`` and itself beating once; every row read in full only when
    the counter moves (the safety net a minute away)."""
    clock = ManualClock()
    rows = Rows(me, clock)
    for worker in (*others, me):
        rows.beat(worker)
    view = TableView(me, failover_s=FAILOVER_S, heartbeat_interval_s=2.0, clock=clock)
    return clock, rows, Membership(rows, view, clock, rng=lambda: 1.0)


async def _read_and_act(rows: Rows, membership: Membership, clock: ManualClock, *, cycles: int) -> None:
    """``cycles`` cycles of this worker alone, a second apart: read, act."""
    for _ in range(cycles):
        await membership.read(rows.members, rows.changes)
        await membership.act()
        clock.t += 1.0


def _cycles(
    rows: Rows,
    membership: Membership,
    clock: ManualClock,
    *,
    until_s: float,
    joins: dict[float, str],
    death_s: float = 2.0,
    read_latency_s: float = 0.0,
) -> None:
    """A cycle a second after the last one ended: every live worker beats (w05 no longer after
    ``death_s``), then this one reads (the watched rows answered ``read_latency_s`` after they were
    asked) and acts."""
    read_some_workers = rows.read_some_workers

    async def slow_read(worker_ids: Iterable[str], *, consistent: bool = False) -> dict[str, WorkerRow | None]:
        answer = await read_some_workers(worker_ids, consistent=consistent)
        clock.t += read_latency_s
        return answer

    rows.read_some_workers = slow_read  # type: ignore[method-assign]

    async def main() -> None:
        waiting = dict(joins)
        while clock.t <= until_s:
            for at_s in [at_s for at_s in waiting if clock.t >= at_s]:
                rows.beat(waiting.pop(at_s))
            for worker in list(rows.beats):
                if worker != "w05" or clock.t <= death_s:
                    rows.beat(worker)
            await membership.read(rows.members, rows.changes)
            await membership.act()
            clock.t += 1.0

    asyncio.run(main())


def test_a_death_is_found_in_time_when_newcomers_take_over_watching_the_dead_worker() -> None:
    """Found by the simulation (seed 39 of 64 x 8, every fault): w005 died at 52.1 s, w012 joined at
    55.4 s and w013 at 60.1 s; around the ring, w005's watchers became the two newcomers, who had read
    its row only since they joined, and w011, which had watched it since before its death, stopped
    watching it: the death was found 13.4 s after it. A worker keeps watching the workers it no longer
    watches for failover_s: whoever watched a death from before it finds it in time."""
    clock, rows, membership = _worker("w11", ("w05", "w10"))
    _cycles(rows, membership, clock, until_s=20.0, joins={3.0: "w12", 8.0: "w13"})
    assert rows.reaped and rows.reaped[0][0] == "w05"
    assert rows.reaped[0][1] <= 2.0 + FAILOVER_S + 1.0, rows.reaped


def test_a_death_found_by_a_slow_read_just_after_the_ring_moved_on_is_still_acted_on() -> None:
    """Found in review: a worker no longer on this one's part of the ring was watched until exactly
    failover_s after it left; a read asked before that moment and answered after it found the worker
    dead, and the same read's end dropped it from the watched, so nobody that had watched it long
    enough reaped it. A worker found dead stays watched until it is reaped or beats again."""
    clock, rows, membership = _worker("w11", ("w05", "w10"))
    _cycles(rows, membership, clock, until_s=40.0, joins={3.0: "w12", 8.0: "w13"}, death_s=7.0, read_latency_s=0.9)
    assert rows.reaped and rows.reaped[0][0] == "w05", "never reaped by the worker that had watched it"
    assert rows.reaped[0][1] <= 7.0 + FAILOVER_S + 4 * (1.0 + 0.9), rows.reaped  # a few of its slow cycles


def test_workers_joining_one_after_another_cost_at_most_twice_the_watched_reads() -> None:
    """Found in review: at a mass start every join moves a worker's part of the ring, and each worker
    it left was watched on for failover_s: about 6 more rows a cycle at 64 workers, 12 at 1,024, all
    on the heartbeat partition key. Only the last WATCHED to leave are watched on."""
    clock, rows, membership = _worker("w00", ())
    largest = 0

    async def main() -> None:
        nonlocal largest
        for second in range(40):
            clock.t = float(second)
            rows.beat(f"w{40 - second:02d}")  # each newcomer sorts just after w00: it moves the ring
            await membership.read(rows.members, rows.changes)
            await membership.act()
            largest = max(largest, len(membership.watching))

    asyncio.run(main())
    assert largest <= 2 * WATCHED, largest


def test_a_watched_row_found_gone_is_announced_to_the_others() -> None:
    """Found by the simulation (seed 755 of 64 x 8, every fault): a stopping worker's delete of its
    row landed but its answer did not (throttling), so it never moved the membership counter. Its
    watchers found the row gone and dropped it; the workers that did not watch it counted it alive
    until their next read of every row, their shares disagreed with the watchers', and a free lease
    went unread for 30 s. A watcher that finds a row gone moves the counter, as a reap does, if it
    has not moved by its next cycle (a clean stop moves it right after its delete)."""
    clock, rows, membership = _worker("w01", ("w02", "w03"))

    async def main() -> None:
        await _read_and_act(
            rows, membership, clock, cycles=2
        )  # the second reads the watched rows only (its start moved the counter)
        members = rows.members
        del rows.beats["w02"]  # deleted, the counter not moved
        for _ in range(2):
            await membership.read(rows.members, rows.changes)
            assert "w02" not in membership.rows
            await membership.act()
            clock.t += 1.0
        assert rows.members == members + 1

    asyncio.run(main())


def test_a_row_found_gone_after_a_clean_stop_moved_the_counter_is_not_announced_again() -> None:
    """A stop deletes its row, then moves the counter: a watcher that read the counter before that
    move and the row after the delete finds the row gone, then the counter moved, and says nothing."""
    clock, rows, membership = _worker("w01", ("w02", "w03"))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=2)
        del rows.beats["w02"]
        await membership.read(rows.members, rows.changes)  # the row gone, the counter not moved yet
        await membership.act()
        await rows.members_changed(not_leaving=["w02"], about=["w02"])  # the stop's move
        members = rows.members
        await _read_and_act(rows, membership, clock, cycles=2)
        assert rows.members == members

    asyncio.run(main())


def test_a_start_and_a_reap_strike_the_names_off_the_version_row_s_stopping_ones() -> None:
    """The version row names the workers that are stopping (they count no share while they read on).
    A worker that died in its stop, reaped, and one that starts again under the name of a stop of its
    own that was cut short, are struck off by the move of the counter that announces them."""
    clock, rows, membership = _worker("w04", ("w05", "w06"))
    _cycles(rows, membership, clock, until_s=16.0, joins={})
    assert rows.reaped and rows.reaped[0][0] == "w05"
    assert rows.struck[0] == {"w04"}, "its own start"
    assert {"w05"} in rows.struck[1:], rows.struck


def test_names_to_strike_are_kept_until_a_move_of_the_counter_lands() -> None:
    """Found in review: a move that failed was tried again as an announcement of this worker
    alone, and the reaped worker's name stayed on the version row. Every name due is kept until a
    move lands."""
    clock, rows, membership = _worker("w04", ("w05", "w06"))

    async def main() -> None:
        await membership.read(rows.members, rows.changes)
        await membership.act()
        assert rows.struck == [{"w04"}], "its own start"
        for second in range(1, 20):
            clock.t = float(second)
            rows.beat("w04")
            rows.beat("w06")  # w05 beats no more: dead at 10 s from its last read
            await membership.read(rows.members, rows.changes)
            reaped = len(rows.reaped)
            rows.failing = 1 if not rows.reaped else 0
            try:
                await membership.act()
            except TimeoutError:
                assert len(rows.reaped) == reaped + 1, "the reap landed, its move did not"
        assert rows.reaped and rows.struck[1:] == [{"w05"}], rows.struck

    asyncio.run(main())


def test_a_name_without_a_row_rides_the_next_move_even_one_another_worker_made_first() -> None:
    """Found in review: w06 stopped, its row deleted and its own move (with its strike) lost; the
    name found gone was kept only until the next read of every row, which a newcomer's start caused
    at once, and so never struck. A newcomer's move names only the newcomer now (the others read its
    row alone): this worker announces w06 gone by name, and strikes it. A name the version row gives
    whose worker has no row is struck by this worker's next move, whoever moved the counter before;
    it causes no move of its own."""
    clock, rows, membership = _worker("w04", ("w05", "w06", *CROWD))  # a named move is read as its rows

    async def cycle(named: set[str]) -> None:
        for worker in list(rows.beats):
            rows.beat(worker)
        await membership.read(rows.members, rows.changes)
        membership.saw_named(frozenset(named), stopping=False)
        await membership.act()
        clock.t += 1.0

    async def main() -> None:
        await cycle(set())
        del rows.beats["w06"]  # stopped: its row deleted, its own move lost
        await cycle({"w06"})
        rows.beat("w07")  # a newcomer starts: the counter moves, named for it
        await cycle({"w06"})
        assert "w06" in rows.changes[rows.members].about and "w06" in rows.struck[-1], (rows.changes, rows.struck)
        members = rows.members
        await cycle({"w06"})  # the version row names it still (the test says so)
        assert rows.members == members, "a name without a row is no reason to move"
        rows.named = False
        rows.members += 1  # someone else's move, not named: every row read
        await cycle({"w06"})
        assert rows.members == members + 1
        members = rows.members
        membership.announce = True  # this worker's own next move (a recovery, say)
        await cycle({"w06"})
        assert rows.struck[-1] == {"w06"} and rows.members == members + 1, rows.struck

    asyncio.run(main())


def test_a_stopping_worker_never_strikes_its_own_name_and_one_running_does() -> None:
    """Found in review: its start's move failed (throttled) and kept its own name to strike; the stop
    named it on the version row, and the stop's cycle struck it again: the others counted it a share
    while it still held its leases. A stopping worker strikes its own name never; one that runs and
    finds itself named (a stop's write that landed late) strikes it."""
    _, rows, membership = _worker("w04", ("w05", "w06"))

    async def main() -> None:
        await membership.read(rows.members, rows.changes)
        rows.failing = 1
        try:
            await membership.act()
        except TimeoutError:
            pass
        await membership.read(rows.members, rows.changes)
        membership.saw_named(frozenset({"w04"}), stopping=True)
        await membership.act()
        assert rows.struck == [set()], "the start announced, its own name not struck"
        membership.saw_named(frozenset({"w04"}), stopping=False)
        await membership.act()
        assert rows.struck[-1] == {"w04"}

    asyncio.run(main())


def test_a_reap_that_fails_holds_up_no_announcement() -> None:
    """Found in review: the announcement was cleared before the reaps, and a reap that raised
    (throttled) lost it and every move after it, cycle after cycle."""
    clock, rows, membership = _worker("w04", ("w05", "w06"))

    async def refused(worker_id: str, heartbeat: int) -> bool:
        raise Retriable("throttled", code="ProvisionedThroughputExceededException")

    async def main() -> None:
        rows.reap_worker = refused  # type: ignore[method-assign]
        for second in range(0, 14):
            clock.t = float(second)
            rows.beat("w04")
            rows.beat("w06")  # w05 dead from 10 s
            await membership.read(rows.members, rows.changes)
            if second == 12:
                membership.announce = True  # a recovery to announce
                members = rows.members
            await membership.act()
        assert rows.members == members + 1

    asyncio.run(main())


def test_a_row_found_gone_is_announced_after_a_move_that_failed() -> None:
    """Found in review: the row found gone stayed to announce only until the next read of the
    watched rows, so a move that failed (throttled) was never tried again, and the workers that
    did not watch the stopped one counted it alive until their next read of every row."""
    clock, rows, membership = _worker("w01", ("w02", "w03"))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=2)
        members = rows.members
        del rows.beats["w02"]  # deleted, the counter not moved
        await membership.read(rows.members, rows.changes)
        await membership.act()
        await membership.read(rows.members, rows.changes)
        rows.failing = 1
        try:
            await membership.act()  # its move throttled
        except TimeoutError:
            pass
        await _read_and_act(rows, membership, clock, cycles=3)
        assert rows.members == members + 1

    asyncio.run(main())


def test_a_recovery_announced_while_a_move_is_under_way_is_announced_by_the_next() -> None:
    """Found in review: the announcement was cleared once a move landed, so one made while the move
    was under way (a recovery, from the heartbeat's task) was cleared with it, though that move may
    have been sent before the recovery's heartbeat landed."""
    _, rows, membership = _worker("w01", ("w02", "w03"))
    move = rows.members_changed

    async def slow_move(*, not_leaving: Iterable[str] = (), about: Iterable[str] = (), stopped: bool = False) -> None:
        await asyncio.sleep(0)
        membership.announce = True  # Coordinator._recovered, meanwhile
        await move(not_leaving=not_leaving, about=about, stopped=stopped)

    async def main() -> None:
        await membership.read(rows.members, rows.changes)
        rows.members_changed = slow_move  # type: ignore[method-assign]
        await membership.act()
        rows.members_changed = move  # type: ignore[method-assign]
        members = rows.members
        await membership.read(rows.members, rows.changes)
        await membership.act()
        assert rows.members == members + 1, "the recovery was never announced"

    asyncio.run(main())


def test_a_move_that_names_its_workers_is_read_as_those_rows_alone() -> None:
    """A stop and a start in a fleet of 40: the watcher reads the two rows named, strongly, not all
    forty (every worker reading every row after each change was W squared / 14 read units on the
    control key: 4,800 in a second at 256 workers)."""
    clock, rows, membership = _worker("w00", tuple(f"w{i:02d}" for i in range(1, 40)))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=2)
        assert rows.full_reads == 1, "its first read: every row"
        del rows.beats["w20"]
        await rows.members_changed(not_leaving=["w20"], about=["w20"])  # a stop
        rows.beat("w40")  # a start
        await _read_and_act(rows, membership, clock, cycles=2)
        assert rows.full_reads == 1 and rows.named_reads == [["w20", "w40"]]
        assert "w20" not in membership.rows and "w40" in membership.rows

    asyncio.run(main())


def test_moves_not_named_or_too_many_to_name_are_read_as_every_row() -> None:
    """A move whose conditional naming lost to another worker's move is not named, and a worker more
    moves behind than the version row keeps cannot know whom they were about: every row is read."""
    clock, rows, membership = _worker("w00", ("w01", "w02", *CROWD))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=1)
        rows.named = False
        rows.beat("w03")
        await _read_and_act(rows, membership, clock, cycles=1)
        assert rows.full_reads == 2 and "w03" in membership.rows
        rows.named = True
        for i in range(MEMBER_CHANGE_SLOTS + 1):
            rows.beat(f"w1{i}")
        await _read_and_act(rows, membership, clock, cycles=1)
        assert rows.full_reads == 3 and rows.named_reads == []
        rows.beat("w30")
        await _read_and_act(rows, membership, clock, cycles=1)
        assert rows.full_reads == 3 and rows.named_reads == [["w30"]]

    asyncio.run(main())


def test_a_row_found_gone_is_announced_when_the_next_move_names_another_worker() -> None:
    """A watched row found gone (its stop's move was lost) while another worker's move, about someone
    else, lands: the others read only that one's row and would count the gone worker alive. The
    watcher announces it by name all the same."""
    clock, rows, membership = _worker("w01", ("w02", "w03", "w04", *CROWD))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=2)
        del rows.beats["w02"]  # its move never comes
        await membership.read(rows.members, rows.changes)
        rows.beat("w09")  # another's start
        await _read_and_act(rows, membership, clock, cycles=2)
        assert any("w02" in change.about for change in rows.changes.values()), rows.changes

    asyncio.run(main())


def test_a_small_fleet_reads_every_row_after_a_move_as_cheaply_as_the_rows_named() -> None:
    """At 8 workers one Query of every row (about 2.4 KB) costs a read unit, as one named row does."""
    clock, rows, membership = _worker("w00", tuple(f"w{i:02d}" for i in range(1, 8)))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=1)
        rows.beat("w08")
        await _read_and_act(rows, membership, clock, cycles=1)
        assert rows.full_reads == 2 and rows.named_reads == [] and "w08" in membership.rows

    asyncio.run(main())


def test_a_named_read_that_fails_is_made_again_at_the_next_cycle() -> None:
    """Found in review: the counter was taken as read before the rows it named were, so a throttled
    read of them was never made again (until the read of every row, a minute on): a reaped worker
    counted alive, a newcomer unseen."""
    clock, rows, membership = _worker("w01", ("w02", "w03", "w05", *CROWD))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=1)
        del rows.beats["w05"]  # reaped by its watchers; the move names it
        rows._move({"w05"})
        read_some_workers = rows.read_some_workers

        async def throttled(worker_ids: Iterable[str], *, consistent: bool = False) -> dict[str, WorkerRow | None]:
            if consistent:
                rows.read_some_workers = read_some_workers  # type: ignore[method-assign]
                raise Retriable("throttled")
            return await read_some_workers(worker_ids, consistent=consistent)

        rows.read_some_workers = throttled  # type: ignore[method-assign]
        try:
            await membership.read(rows.members, rows.changes)
        except Retriable:
            pass  # the cycle fails; the next one reads again
        await _read_and_act(rows, membership, clock, cycles=1)
        assert "w05" not in membership.rows

    asyncio.run(main())


@pytest.mark.parametrize("crowd", [CROWD, ()], ids=["named rows read", "every row read"])
def test_a_stop_that_released_everything_is_known_as_one_on_either_read(crowd: tuple[str, ...]) -> None:
    """A move that ends a stop which released every lease says so: what a lease read from before the
    releases shows that worker holding is not a dead worker's (decision.Lag). Known whether the rows
    named are read or every row is (a small fleet, the safety net); a reap is not a stop."""
    clock, rows, membership = _worker("w01", ("w02", "w03", "w05", *crowd))

    async def main() -> None:
        await _read_and_act(rows, membership, clock, cycles=1)
        del rows.beats["w05"]
        rows._move({"w05"}, stopped={"w05"})
        del rows.beats["w03"]
        rows._move({"w03"})  # reaped
        await _read_and_act(rows, membership, clock, cycles=1)

    asyncio.run(main())
    assert membership._view.stopped_lately() == {"w05"}


def test_a_move_after_an_unnamed_one_of_this_worker_s_own_is_named() -> None:
    """Found in review: a move that went unnamed (three moves of others since this worker's read, a
    mass start) left the counter as this worker knew it at that read, so its next move before a read
    was conditional on a counter long gone and went unnamed too: every worker read every heartbeat
    row again. The unnamed move tells this worker the counter it set: its next move is named."""
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")

    async def scenario() -> None:
        clock = SimClock()
        tables = [
            LeaseTable(
                db.client(name, clock, random.Random(seed)),
                table="t",
                app="a",
                stream_arn="s",
                worker_id=name,
                clock=clock,
            )
            for seed, name in enumerate(("w1", "w2"))
        ]
        table, other = tables
        members = (await table.read_version()).members
        await other.read_version()
        for name in ("w3", "w4", "w5"):
            await other.members_changed(about=[name])
        await table.members_changed(about=["w6"])  # three moves behind: unnamed
        await table.members_changed(about=["w7"])  # nobody moved since its own move: named
        control = await other.read_version()
        assert control.members == members + 5
        assert {n - members: set(change.about) for n, change in control.member_changes.items()} == {
            1: {"w3"},
            2: {"w4"},
            3: {"w5"},
            5: {"w7"},
        }

    run(scenario())
