"""The table view alone: who is alive, dead or in doubt, as one worker's successive reads show it."""

from __future__ import annotations

from efo.leases.table import Lease, TableState, WorkerRow
from efo.leases.view import TableView
from efo.pipeline.records import Position
from efo.sim.clock import ManualClock


def _state(
    beats: dict[str, int], *, doubting: frozenset[str] = frozenset(), owners: dict[str, str] | None = None
) -> TableState:
    workers = {name: WorkerRow(name, beat, None, in_doubt=name in doubting) for name, beat in beats.items()}
    leases = {shard: Lease(shard, (), owner, 1, Position("TRIM_HORIZON")) for shard, owner in (owners or {}).items()}
    return TableState(workers=workers, leases=leases)


def test_a_slow_read_never_makes_a_live_worker_look_older_than_it_is() -> None:
    """Race a of issue 37: the view took 'now' after the reads; a read issued at 9 s and answered at
    17 s (throttled, then the lease partitions) made a counter first seen at 0 s look 17 s old. A
    counter still the same counts as unchanged up to when the read was issued."""
    view = TableView("me", failover_s=10.0, clock=ManualClock())
    view.update(_state({"me": 1, "other": 5}), issued_at=0.0, answered_at=0.0)
    view.update(_state({"me": 2, "other": 5}), issued_at=9.0, answered_at=17.0)
    assert "other" in view.live and not view.dead
    view.update(_state({"me": 3, "other": 5}), issued_at=10.0, answered_at=10.5)
    assert view.dead == {"other"} and view.owner_is_dead("other")


def test_a_counter_first_seen_counts_from_when_its_read_was_answered() -> None:
    view = TableView("me", failover_s=10.0, clock=ManualClock())
    view.update(_state({"me": 1, "other": 5}), issued_at=0.0, answered_at=4.0)
    view.update(_state({"me": 2, "other": 5}), issued_at=13.9, answered_at=14.0)
    assert "other" in view.live
    view.update(_state({"me": 3, "other": 5}), issued_at=14.0, answered_at=14.1)
    assert "other" in view.dead
    assert view.next_death_at() is None


def test_an_owner_without_a_heartbeat_row_is_not_alive() -> None:
    """A worker that stopped removed its row (what it could not release stays its own), and a dead
    one's row is reaped: a worker that starts later takes their leases at once."""
    view = TableView("me", failover_s=10.0, clock=ManualClock())
    view.update(_state({"me": 1}, owners={"shard-1": "gone"}), issued_at=0.0, answered_at=0.0)
    assert view.owner_is_dead("gone") and view.live == {"me"}


def test_a_worker_whose_heartbeat_says_it_is_in_doubt_is_not_alive_while_its_counter_moves() -> None:
    view = TableView("me", failover_s=10.0, clock=ManualClock())
    view.update(_state({"me": 1, "other": 5}, doubting=frozenset({"other"})), issued_at=0.0, answered_at=0.0)
    assert view.owner_is_dead("other") and "other" not in view.dead
    view.update(_state({"me": 2, "other": 6}), issued_at=2.0, answered_at=2.0)
    assert "other" in view.live


def test_a_fresh_read_of_a_worker_thought_dead_brings_it_back_if_its_counter_moved() -> None:
    view = TableView("me", failover_s=10.0, clock=ManualClock())
    view.update(_state({"me": 1, "other": 5}), issued_at=0.0, answered_at=0.0)
    view.update(_state({"me": 2, "other": 5}), issued_at=10.0, answered_at=10.0)
    assert view.confirm("other", 5, False, read_at=10.5), "the same counter: still dead"
    assert not view.confirm("other", 6, False, read_at=11.0), "it beat since: alive"
    assert "other" in view.live and view.next_death_at() == 21.0
    assert view.confirm("other", 7, True, read_at=12.0), "alive, but in doubt"
    assert view.confirm("other", None, False, read_at=12.0), "no row any more"
