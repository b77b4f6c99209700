"""The table view alone: who is alive, dead or in doubt, as one worker's successive reads show it."""

from __future__ import annotations

import random
from dataclasses import replace

from efo.leases.model import Lease, WorkerRow
from efo.leases.view import TableView
from efo.pipeline.records import Position
from efo.sim.clock import ManualClock


def _rows(beats: dict[str, int | None], *, doubting: frozenset[str] = frozenset()) -> dict[str, WorkerRow | None]:
    return {
        name: None if beat is None else WorkerRow(name, beat, None, in_doubt=name in doubting)
        for name, beat in beats.items()
    }


def _view() -> TableView:
    return TableView("me", failover_s=10.0, heartbeat_interval_s=2.0, clock=ManualClock())


def test_a_slow_read_never_makes_a_live_worker_look_older_than_it_is() -> None:
    """Race a of issue 37: the view took 'now' after the reads; a read issued at 9 s and answered at
    17 s (throttled, then the lease partitions) made a counter first seen at 0 s look 17 s old. A
    counter still the same counts as unchanged up to when the read was issued."""
    view = _view()
    view.saw_workers(_rows({"me": 1, "other": 5}), issued_at=0.0, answered_at=0.0, complete=True)
    view.saw_workers(_rows({"me": 2, "other": 5}), issued_at=9.0, answered_at=17.0, complete=True)
    assert "other" in view.live and not view.dead
    view.saw_workers(_rows({"me": 3, "other": 5}), issued_at=10.0, answered_at=10.5, complete=True)
    assert view.dead == {"other"} and view.owner_is_dead("other")


def test_a_counter_that_changed_counts_from_the_previous_read_only_if_that_was_recent() -> None:
    """It landed after the previous read was issued: counting from there is never early when that
    read was at most a heartbeat interval before (the owner trusts its leases failover_s minus a
    heartbeat interval after sending); from longer ago, it counts from this read's answer."""
    view = _view()
    view.saw_workers(_rows({"other": 5}), issued_at=0.0, answered_at=0.1, complete=False)
    view.saw_workers(_rows({"other": 6}), issued_at=1.0, answered_at=1.1, complete=False)  # 1.1 - 0.0 <= 2
    view.saw_workers(_rows({"other": 6}), issued_at=10.0, answered_at=10.1, complete=False)
    assert "other" in view.dead, "unchanged from 0 s (the read before the change) to 10 s"
    view = _view()
    view.saw_workers(_rows({"other": 5}), issued_at=0.0, answered_at=0.1, complete=False)
    view.saw_workers(_rows({"other": 6}), issued_at=5.0, answered_at=5.1, complete=False)  # 5.1 - 0.0 > 2
    view.saw_workers(_rows({"other": 6}), issued_at=14.0, answered_at=14.1, complete=False)
    assert "other" in view.live, "counts from 5.1 s: 8.9 s unchanged"
    assert view.next_death_at({"other"}) == 15.1


def test_an_owner_without_a_heartbeat_row_is_not_alive() -> None:
    """A worker that stopped removed its row (what it could not release stays its own), and a dead
    one's row is reaped: a worker that starts later takes their leases at once."""
    view = _view()
    view.saw_workers(_rows({"me": 1, "gone": 3}), issued_at=0.0, answered_at=0.0, complete=True)
    view.saw_workers(_rows({"me": 2}), issued_at=1.0, answered_at=1.0, complete=True)
    assert view.owner_is_dead("gone") and view.live == {"me"}
    view.saw_workers(_rows({"other": 4}), issued_at=2.0, answered_at=2.0, complete=True)
    view.saw_workers(_rows({"other": None}), issued_at=3.0, answered_at=3.0, complete=False)
    assert view.owner_is_dead("other")


def test_a_worker_whose_heartbeat_says_it_is_in_doubt_is_not_alive_while_its_counter_moves() -> None:
    view = _view()
    view.saw_workers(
        _rows({"me": 1, "other": 5}, doubting=frozenset({"other"})), issued_at=0.0, answered_at=0.0, complete=True
    )
    assert view.owner_is_dead("other") and "other" not in view.dead and view.doubting == {"other"}
    view.saw_workers(_rows({"me": 2, "other": 6}), issued_at=2.0, answered_at=2.0, complete=True)
    assert "other" in view.live


def test_rows_read_in_part_leave_the_others_as_they_were() -> None:
    """Only the watched rows are read most cycles: a worker not read again is neither refreshed nor
    aged (its death is known from those who watch it)."""
    view = _view()
    view.saw_workers(_rows({"me": 1, "a": 1, "b": 1}), issued_at=0.0, answered_at=0.0, complete=True)
    view.saw_workers(_rows({"a": 2}), issued_at=30.0, answered_at=30.0, complete=False)
    assert view.live == {"me", "a", "b"}


def test_each_worker_watches_the_ones_after_it_around_the_ring() -> None:
    view = _view()
    view.saw_workers(_rows({"a": 1, "me": 1, "x": 1, "z": 1}), issued_at=0.0, answered_at=0.0, complete=True)
    assert view.watched(2) == ["x", "z"]
    view = TableView("z", failover_s=10.0, heartbeat_interval_s=2.0, clock=ManualClock())
    view.saw_workers(_rows({"a": 1, "me": 1, "z": 1}), issued_at=0.0, answered_at=0.0, complete=True)
    assert view.watched(2) == ["a", "me"] and view.watched(5) == ["a", "me"]


def test_a_worker_leaving_hands_its_part_of_the_ring_to_the_ones_before_it_as_its_stop_begins() -> None:
    """A stop lasts seconds (its subscriptions read on, the sink commits): its watchers must be in
    place before its row is gone, or a worker dying meanwhile is found late by ones that first read
    its row after the death (simulation seed 882 of 64 x 8, every fault)."""
    rows = {name: WorkerRow(name, 1, None, leaving=name == "b") for name in ("a", "b", "c", "d", "e")}
    views = {}
    for name in rows:
        views[name] = TableView(name, failover_s=10.0, heartbeat_interval_s=2.0, clock=ManualClock())
        views[name].saw_workers(dict(rows), issued_at=0.0, answered_at=0.0, complete=True)
    assert views["a"].watched(2) == ["b", "c", "d"]  # b leaves: a watches on to the second that does not
    assert views["e"].watched(2) == ["a", "b", "c"]
    assert views["b"].watched(2) == ["c", "d"]  # the leaving one watches on while it runs
    watchers = {name: {w for w, view in views.items() if name in view.watched(2) and w != "b"} for name in rows}
    assert all(len(who) == 2 for who in watchers.values()), watchers  # two that stay, for every one


def test_a_fresh_read_of_a_worker_thought_dead_brings_it_back_if_its_counter_moved() -> None:
    view = _view()
    view.saw_workers(_rows({"me": 1, "other": 5}), issued_at=0.0, answered_at=0.0, complete=True)
    view.saw_workers(_rows({"me": 2, "other": 5}), issued_at=10.0, answered_at=10.0, complete=True)
    assert view.confirm("other", _row("other", 5), issued_at=10.5, answered_at=10.5), "the same counter: still dead"
    assert not view.confirm("other", _row("other", 6), issued_at=11.0, answered_at=11.0), "it beat since: alive"
    assert "other" in view.live and view.next_death_at({"other"}) == 20.5  # it changed after the read at 10.5
    assert view.confirm("other", _row("other", 7, in_doubt=True), issued_at=12.0, answered_at=12.0), "in doubt"
    assert view.confirm("other", None, issued_at=12.0, answered_at=12.0), "no row any more"


def test_a_slow_confirmation_read_counts_a_new_counter_from_its_answer_not_from_when_it_was_asked() -> None:
    """Found by the simulation (seed 109 of 64 x 8, every fault): a confirmation read issued at 102 s
    and answered at 120 s (an outage) found a counter written at 120 s, and counted it from 102 s; the
    next read at 121.5 s found it unchanged, 19 s 'old', and the worker's leases were taken from it."""
    view = _view()
    view.saw_workers(_rows({"me": 1, "other": 34}), issued_at=66.0, answered_at=66.0, complete=True)
    assert not view.confirm("other", _row("other", 61), issued_at=102.0, answered_at=120.0)
    view.saw_workers(_rows({"me": 2, "other": 61}), issued_at=121.5, answered_at=121.5, complete=True)
    assert "other" in view.live and not view.dead


def _row(name: str, beat: int, *, in_doubt: bool = False) -> WorkerRow:
    return WorkerRow(name, beat, None, in_doubt=in_doubt)


class _FullRead:
    """What saw_leases worked out from every lease of every read, before it looked only at what changed."""

    def __init__(self) -> None:
        self.holders: dict[str, tuple[str | None, int]] = {}
        self.moved_at: dict[str, float] = {}
        self.asked_seen: dict[tuple[str, str], float] = {}

    def saw_leases(self, leases: dict[str, Lease], answered_at: float) -> None:
        for shard_id, lease in leases.items():
            holder = (lease.owner, lease.counter)
            if self.holders.get(shard_id, holder) != holder:
                self.moved_at[shard_id] = answered_at
            self.holders[shard_id] = holder
        asked = {(lease.shard_id, lease.wanted_by) for lease in leases.values() if lease.wanted_by}
        self.asked_seen = {key: self.asked_seen.get(key, answered_at) for key in asked}  # type: ignore[misc]


def _changed(rng: random.Random, leases: dict[str, Lease], workers: list[str]) -> dict[str, Lease]:
    """The next read: some leases moved, asked for, answered, rewritten as they were, deleted or new."""
    after = dict(leases)
    for shard_id in rng.sample(sorted(after), k=min(len(after), rng.randrange(4))):
        lease = after[shard_id]
        match rng.randrange(6):
            case 0:
                after[shard_id] = replace(lease, owner=rng.choice([None, *workers]), counter=lease.counter + 1)
            case 1:
                after[shard_id] = replace(lease, wanted_by=rng.choice([None, *workers]))
            case 2:
                after[shard_id] = replace(lease)  # the same row read again: a new object, nothing moved
            case 3:
                del after[shard_id]
            case 4:
                after[shard_id] = replace(lease, owner=lease.owner, counter=lease.counter)
            case _:
                after[shard_id] = replace(lease, wanted_by=None, owner=rng.choice(workers))
    for _ in range(rng.randrange(2)):
        shard_id = f"s{rng.randrange(40)}"
        after.setdefault(shard_id, Lease(shard_id, (), rng.choice([None, *workers]), 1, Position("TRIM_HORIZON")))
    return after


def test_looking_only_at_the_leases_that_changed_sees_what_looking_at_every_lease_saw() -> None:
    """saw_leases skips the leases that are the same objects as in the last read: over random
    sequences of reads (moves, requests, deletions, rows read again as new objects, the caller
    changing its map after handing it over), what it knows equals the full recomputation's."""
    workers = ["me", "a", "b", "c"]
    for seed in range(150):
        rng = random.Random(seed)
        clock = ManualClock()
        view = TableView("me", failover_s=10.0, heartbeat_interval_s=2.0, clock=clock)
        view.saw_workers(_rows(dict.fromkeys(workers, 1)), issued_at=0.0, answered_at=0.0, complete=True)
        full = _FullRead()
        leases = {
            f"s{i}": Lease(f"s{i}", (), rng.choice([None, *workers]), 1, Position("TRIM_HORIZON")) for i in range(20)
        }
        for step in range(60):
            clock.t = float(step)
            leases = _changed(rng, leases, workers)
            view.saw_leases(leases, answered_at=clock.t)
            full.saw_leases(leases, clock.t)
            if rng.random() < 0.2 and leases:  # the cycle puts a lease of its own into the map it was given
                shard_id = rng.choice(sorted(leases))
                leases[shard_id] = replace(leases[shard_id], owner="me", counter=leases[shard_id].counter + 1)
            for window in (0.5, 3.0, 10.0, 1000.0):
                expected = {shard_id for shard_id, at in full.moved_at.items() if clock.t - at < window}
                assert view.moved_within(window) == expected, (seed, step, window)
            expected_reserved = {
                shard_id
                for (shard_id, asker), since in full.asked_seen.items()
                if asker != "me" and clock.t - since < 10.0
            }
            assert view.reserved_for_others() == expected_reserved, (seed, step)


def test_moves_within_a_window_look_at_the_recent_moves_and_equal_every_move_looked_at() -> None:
    """moved_within stops at the first move older than its window (the moves are kept newest last):
    over random reads, some answered before an earlier one (which the clock never does, and then
    every move is looked at), it equals the full recomputation's."""
    workers = ["me", "a", "b", "c"]
    for seed in range(150):
        rng = random.Random(seed)
        clock = ManualClock()
        view = TableView("me", failover_s=10.0, heartbeat_interval_s=2.0, clock=clock)
        full = _FullRead()
        leases = {
            f"s{i}": Lease(f"s{i}", (), rng.choice([None, *workers]), 1, Position("TRIM_HORIZON")) for i in range(20)
        }
        backwards = seed % 3 == 0
        for step in range(60):
            clock.t = float(step)
            answered_at = clock.t - (rng.choice([0.0, 2.5]) if backwards else 0.0)
            leases = _changed(rng, leases, workers)
            view.saw_leases(leases, answered_at=answered_at)
            full.saw_leases(leases, answered_at)
            for window in (0.5, 1.0, 3.0, 10.0, 1000.0):
                expected = {shard_id for shard_id, at in full.moved_at.items() if clock.t - at < window}
                assert view.moved_within(window) == expected, (seed, step, window)


def test_a_worker_is_leaving_when_its_heartbeat_or_the_version_row_says_so_and_while_it_lives() -> None:
    view = _view()
    view.saw_workers(
        {"a": WorkerRow("a", 1, None, leaving=True), "b": WorkerRow("b", 1, None), "me": WorkerRow("me", 1, None)},
        issued_at=0.0,
        answered_at=0.0,
        complete=True,
    )
    assert view.leaving == {"a"}
    view.saw_leaving(frozenset({"b", "gone", "me"}))  # a name without a row, and its own, count for nothing
    assert view.leaving == {"a", "b"}
    view.saw_workers({"b": None}, issued_at=1.0, answered_at=1.0, complete=False)  # b stopped: its row is gone
    assert view.leaving == {"a"} and "b" not in view.live
