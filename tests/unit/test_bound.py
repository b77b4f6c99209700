"""A bounded run's rule per shard (:class:`efo.worker.bound.ShardBound`): caught up at the first
event at 0 ms behind, cut at the first record at or after ``until`` (the checkpoint there, nothing
after it handed on, its budget returned), done only when the shard is known open; the states'
transitions; and the worker's ``done`` over a lease-table view."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from efo.config import RunSettings, Until
from efo.errors import ShardTimeout
from efo.kinesis.graph import Shard, ShardGraph
from efo.kinesis.subscription import ShardEnded
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import Lease, TableState
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position, RecordChunk, Row, after
from efo.sim.clock import ManualClock
from efo.worker.bound import BOUND_TRANSITIONS, BoundState, IllegalBoundTransition, RunEnd, ShardBound
from efo.worker.cycle import parents_finished

UNTIL = Until(datetime(2026, 1, 31, 12, 0, tzinfo=UTC))
UNTIL_MS = UNTIL.time_ms or 0


class Clock(ManualClock):
    def __init__(self) -> None:
        super().__init__(100.0)


def _owned(shard_id: str = "shard-0", owner: str = "me") -> OwnedShard:
    return OwnedShard.claim(Lease(shard_id, (), owner, 1, Position("TRIM_HORIZON")), owner, lambda owned: None)


def _bound(until: Until = UNTIL, clock: Clock | None = None) -> tuple[ShardBound, Handoff, PendingPool]:
    handoff, pool = Handoff(), PendingPool(1000, 1 << 20)
    return ShardBound(_owned(), until, handoff, pool, clock=clock or Clock()), handoff, pool


def _event(bound: ShardBound, pool: PendingPool, arrivals: list[int], first_seq: int, lag_ms: int = 5) -> RecordChunk:
    """What the subscription does with one event: its lag, the chunk announced, then put."""
    rows = [Row(str(first_seq + i), b"xy", f"k{i}", arrival) for i, arrival in enumerate(arrivals)]
    chunk = RecordChunk.of_rows("s", bound.shard_id, 0, rows, epoch=1)
    chunk.grant = pool.try_acquire(len(chunk), chunk.data_bytes)
    bound.owned.series.event(lag_ms)
    chunk.serial = bound.next_serial()
    bound.enqueued(chunk.serial, after(str(first_seq + len(arrivals) - 1)))
    bound.put(chunk)
    return chunk


def _taken(handoff: Handoff) -> list[str]:
    return [seq for chunk in handoff.take_batch(10_000, 1 << 30, 0.0, 0.0) for seq in chunk.sequence_numbers]


def test_records_before_until_pass_through_and_are_counted() -> None:
    bound, handoff, pool = _bound()
    _event(bound, pool, [UNTIL_MS - 2, UNTIL_MS - 1], 10)
    assert _taken(handoff) == ["10", "11"]
    assert (bound.state, bound.records, bound.bytes) == (BoundState.READING, 2, 4)
    assert bound.owned.ledger.outstanding == 1


def test_the_chunk_is_cut_before_the_first_record_at_until_and_the_checkpoint_is_that_record() -> None:
    bound, handoff, pool = _bound()
    _event(bound, pool, [UNTIL_MS - 1, UNTIL_MS, UNTIL_MS + 1], 10)
    assert _taken(handoff) == ["10"]
    assert bound.state is BoundState.CUT and bound.reached.is_set()
    ledger = bound.owned.ledger
    ledger.committed(1, 1)
    assert ledger.due == Position("AT_SEQUENCE_NUMBER", "11"), "the next run starts at the first record not delivered"


def test_after_the_cut_nothing_is_handed_on_and_the_budget_comes_back() -> None:
    bound, handoff, pool = _bound()
    _event(bound, pool, [UNTIL_MS + 5], 10)
    assert bound.state is BoundState.CUT and _taken(handoff) == []
    _event(bound, pool, [UNTIL_MS - 5], 11)  # arrival times never go down in a shard; even so, nothing passes
    bound.idle(after("99"))
    assert _taken(handoff) == [] and pool.records == 0 and bound.owned.ledger.outstanding == 0
    assert bound.owned.ledger.due is None, "an empty event past the cut moved the checkpoint"


def test_caught_up_at_the_first_event_at_0_ms_behind_once_its_records_were_handed_on() -> None:
    bound, handoff, pool = _bound(Until())
    _event(bound, pool, [1, 2], 10, lag_ms=3000)
    assert bound.state is BoundState.READING
    _event(bound, pool, [3], 12, lag_ms=0)
    assert bound.state is BoundState.CAUGHT_UP and _taken(handoff) == ["10", "11", "12"]
    _event(bound, pool, [4], 13, lag_ms=0)  # a caught-up open shard reads on until the worker stops
    assert _taken(handoff) == ["13"]


def test_an_empty_event_at_0_ms_behind_also_catches_up() -> None:
    bound, _, _ = _bound(Until())
    bound.owned.series.event(0)
    bound.idle(after("5"))
    assert bound.state is BoundState.CAUGHT_UP


def test_caught_up_is_done_only_once_a_listing_since_shows_the_shard_open() -> None:
    clock = Clock()
    bound, _, _ = _bound(Until(), clock)
    bound.owned.series.event(0)
    bound.idle(after("5"))
    open_graph = ShardGraph.of([Shard("shard-0", (), 0, 10)])
    closed_graph = ShardGraph.of([Shard("shard-0", (), 0, 10), Shard("shard-1", ("shard-0",), 0, 5)])
    assert not bound.done(open_graph, listed_at=clock.t - 1), "a listing older than the catch-up"
    assert bound.done(open_graph, listed_at=clock.t)
    assert not bound.done(closed_graph, listed_at=clock.t), "a closed shard is read to its end"
    bound.enter(BoundState.ENDED)
    assert bound.done(closed_graph, listed_at=0.0)


def test_bound_states_move_only_forward() -> None:
    bound, _, _ = _bound()
    bound.enter(BoundState.CAUGHT_UP)
    with pytest.raises(IllegalBoundTransition):
        bound.enter(BoundState.READING)
    assert all(not BOUND_TRANSITIONS[state] for state in (BoundState.CUT, BoundState.ENDED))


def test_at_bound_is_a_stop_of_its_own_left_only_by_release_or_loss() -> None:
    owned = _owned()
    owned.enter(ShardPhase.READING)
    owned.enter(ShardPhase.AT_BOUND)
    assert not owned.phase.reading and not owned.phase.terminal
    owned.enter(ShardPhase.RELEASING)
    owned.enter(ShardPhase.RELEASED)


def test_read_stops_the_subscription_at_the_cut() -> None:
    async def scenario() -> None:
        bound, _, _ = _bound()
        cancelled = asyncio.Event()

        async def subscription() -> str:
            try:
                await asyncio.sleep(3600)
            finally:
                cancelled.set()
            return "ended"

        reading = asyncio.create_task(bound.read(subscription()))
        await asyncio.sleep(0)
        bound.enter(BoundState.CUT)
        assert await asyncio.wait_for(reading, 5) is None
        assert cancelled.is_set()

    asyncio.run(scenario())


# ---- the worker -------------------------------------------------------------------------------


class View:
    """A worker's view for RunEnd: its claims, the last table read (its LeaseView) and the last
    listing (its ShardListing)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.owned: dict[str, OwnedShard] = {}
        self.state: TableState | None = None
        self.read_at: float | None = None
        self.graph: ShardGraph | None = None
        self.listed_at = 0.0
        self.live = {"me"}

    def run_end(self, **settings: Any) -> RunEnd:
        end = RunEnd(
            settings=RunSettings(**settings),
            until=Until(),
            worker_id="me",
            handoff=Handoff(),
            pool=PendingPool(1000, 1 << 20),
            owned=self.owned,
            listing=self,
            parents_finished=parents_finished,
            clock=self.clock,
        )
        end.connect(self)
        return end

    def list_now(self) -> None:
        """A listing asked for: the test sets the next one itself."""

    def table(self, *leases: Lease) -> None:
        self.state = TableState(leases={lease.shard_id: lease for lease in leases})
        self.listed_at = self.clock.t
        self.read_at = self.clock.t


def _caught_up(end: RunEnd, owned: OwnedShard) -> None:
    owned.enter(ShardPhase.READING)
    bound = end.track(owned)
    owned.series.event(0)
    bound.idle(after("5"))


def test_the_worker_is_done_when_its_claims_are_caught_up_and_nothing_is_left_to_claim() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end()
    view.graph = ShardGraph.of([Shard("a", (), 0, 5), Shard("b", (), 6, 10)])
    view.owned["a"] = _owned("a")
    _caught_up(end, view.owned["a"])
    mine = Lease("a", (), "me", 1, Position("TRIM_HORIZON"))
    clock.t += 1
    view.table(mine, Lease("b", (), None, 0, Position("TRIM_HORIZON")))
    assert not end.done(), "shard b is free: someone must read it"
    view.table(mine, Lease("b", (), "other", 1, Position("TRIM_HORIZON")))
    assert not end.done(), "b's owner is not live"
    view.live = {"me", "other"}
    assert end.done()
    view.graph = ShardGraph.of([*view.graph.shards.values(), Shard("c", ("a",), 0, 5)])
    assert not end.done(), "a split: c has no lease yet, and a is closed"


def test_a_finished_parent_s_children_must_be_claimed_and_a_child_of_an_unfinished_one_waits() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end()
    view.graph = ShardGraph.of([Shard("p", (), 0, 10), Shard("c1", ("p",), 0, 5), Shard("c2", ("p",), 6, 10)])
    view.live = {"me", "other"}
    parent = Lease("p", (), "other", 1, Position("TRIM_HORIZON"))
    children = [Lease(c, ("p",), None, 0, Position("TRIM_HORIZON")) for c in ("c1", "c2")]
    view.table(parent, *children)
    assert end.done(), "the parent's reader reads it to its end; its children wait for that"
    view.table(Lease("p", (), None, 2, SHARD_END), *children)
    assert not end.done(), "the parent finished: its children are free to read"


def test_a_silent_shard_short_of_the_bound_times_out_naming_it_and_the_setting() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end(shard_timeout_s=30)
    owned = view.owned["a"] = _owned("a")
    end.track(owned)
    clock.t += 29
    end._check_timeouts()
    clock.t += 2
    with pytest.raises(ShardTimeout, match=r"run\.shard_timeout_s.*\ba\b"):
        end._check_timeouts()


def test_progress_counts_shards_done_records_bytes_and_the_slowest_lag() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end()
    view.graph = ShardGraph.of([Shard("a", (), 0, 5), Shard("b", (), 6, 10)])
    view.owned.update({"a": _owned("a"), "b": _owned("b")})
    _caught_up(end, view.owned["a"])
    view.owned["b"].enter(ShardPhase.READING)
    bound_b = end.track(view.owned["b"])
    handoff_pool = PendingPool(1000, 1 << 20)
    _event(bound_b, handoff_pool, [1, 2, 3], 10, lag_ms=7000)
    clock.t += 1
    view.table(Lease("a", (), "me", 1, Position("TRIM_HORIZON")), Lease("b", (), "me", 1, Position("TRIM_HORIZON")))
    fields = end.progress()
    assert (fields["shards_done"], fields["shards_total"], fields["records"], fields["bytes"]) == (1, 2, 3, 6)
    assert fields["max_lag_ms"] == 7000


def test_a_readable_lease_nobody_claims_times_out_too_naming_the_cap() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end(shard_timeout_s=30)
    view.graph = ShardGraph.of([Shard("a", (), 0, 5), Shard("b", (), 6, 10)])
    view.owned["a"] = _owned("a")
    _caught_up(end, view.owned["a"])
    view.table(Lease("a", (), "me", 1, Position("TRIM_HORIZON")), Lease("b", (), None, 0, Position("TRIM_HORIZON")))
    end.remaining()
    clock.t += 29
    end.remaining()
    end._check_timeouts()
    clock.t += 2
    with pytest.raises(ShardTimeout, match=r"\bb\b.*max_leases_per_worker"):
        end._check_timeouts()


# ---- a cut on a closed shard (the subscription ends in the same step, or reads on to SHARD_END) ----


def test_read_returns_none_at_the_cut_even_when_the_subscription_ended_in_the_same_step() -> None:
    """The shard's last event holds the cut record and no continuation: the subscription returns
    ShardEnded in the same step as the cut. It must not be taken for the shard's end (SHARD_END over
    the cut's checkpoint would lose every record from the cut on)."""

    async def scenario() -> None:
        bound, _, pool = _bound()

        async def subscription() -> ShardEnded:
            _event(bound, pool, [UNTIL_MS - 1, UNTIL_MS], 10)  # the cut
            return ShardEnded(("child-1", "child-2"))

        assert await bound.read(subscription()) is None
        assert bound.state is BoundState.CUT

    asyncio.run(scenario())


def test_read_returns_none_at_the_cut_when_the_subscription_read_ahead_to_shard_end() -> None:
    async def scenario() -> None:
        bound, _, pool = _bound()

        async def subscription() -> ShardEnded:
            _event(bound, pool, [UNTIL_MS], 10)  # the cut
            _event(bound, pool, [UNTIL_MS + 1], 11)  # past it: dropped
            bound.idle(after("11"))
            return ShardEnded(("child-1",))

        assert await bound.read(subscription()) is None
        assert bound.owned.ledger.outstanding == 0

    asyncio.run(scenario())


def test_a_sub_millisecond_until_rounds_up_so_a_record_before_it_is_delivered() -> None:
    """TIME 12:00:00.0005: a record that arrived at 12:00:00.000 (arrival times are whole ms) is before it."""
    until = Until(datetime(2026, 1, 31, 12, 0, 0, 500, tzinfo=UTC))
    assert until.time_ms == UNTIL_MS + 1
    bound, handoff, pool = _bound(until)
    _event(bound, pool, [UNTIL_MS, UNTIL_MS + 1], 10)
    assert _taken(handoff) == ["10"] and bound.state is BoundState.CUT


# ---- a run that cannot catch up, or cannot see the table: it still ends ------------------------


def test_a_busy_shard_is_caught_up_once_a_record_that_arrived_after_the_run_started_was_handed_on() -> None:
    """Written faster than the sink commits, a shard never reports 0 ms behind; every record that
    arrived before the run started is delivered once one that arrived at or after it was."""
    started_ms = UNTIL_MS
    handoff, pool = Handoff(), PendingPool(1000, 1 << 20)
    bound = ShardBound(_owned(), Until(), handoff, pool, clock=Clock(), started_ms=started_ms)
    _event(bound, pool, [started_ms - 10, started_ms - 1], 10, lag_ms=5000)
    assert bound.state is BoundState.READING
    _event(bound, pool, [started_ms - 1, started_ms], 12, lag_ms=5000)
    assert bound.state is BoundState.CAUGHT_UP and _taken(handoff) == ["10", "11", "12", "13"]


def test_the_run_ends_at_max_duration_s_as_out_of_time_not_done() -> None:
    async def scenario() -> None:
        clock = Clock()
        view = View(clock)
        end = view.run_end(max_duration_s=60, shard_timeout_s=30)
        clock.t += 61  # and no listing or table read ever: max_duration_s is the milder end, it wins
        await asyncio.wait_for(end.run(), 5)
        assert end.finished.is_set() and end.out_of_time

    asyncio.run(scenario())


def test_no_listing_or_table_read_for_shard_timeout_s_ends_the_run_naming_the_setting() -> None:
    clock = Clock()
    view = View(clock)
    end = view.run_end(shard_timeout_s=30)
    view.graph = ShardGraph.of([Shard("a", (), 0, 5)])
    view.table(Lease("a", (), "other", 1, Position("TRIM_HORIZON")))
    view.live = {"me", "other"}
    clock.t += 29
    end._check_timeouts()
    clock.t += 2
    with pytest.raises(ShardTimeout, match=r"lease-table read.*run\.shard_timeout_s"):
        end._check_timeouts()
    view.read_at = clock.t  # the table is read again, the listing still fails
    with pytest.raises(ShardTimeout, match=r"shard listing.*run\.shard_timeout_s"):
        end._check_timeouts()


def test_a_cut_shard_s_lag_is_not_reported_any_more() -> None:
    """A 7-day replay cut at TIME: its last lag (7 days) must not stay in max_lag_ms nor in
    efo_shard_lag_seconds until the run ends (it would fire EfoShardLagHigh)."""
    from efo.observability import METRICS

    clock = Clock()
    view = View(clock)
    end = view.run_end()
    end.until = UNTIL
    view.graph = ShardGraph.of([Shard("cut-a", (), 0, 5), Shard("busy-b", (), 6, 10)])
    view.owned.update({"cut-a": _owned("cut-a"), "busy-b": _owned("busy-b")})
    week_ms = 7 * 86400 * 1000
    for shard_id in view.owned:
        view.owned[shard_id].enter(ShardPhase.READING)
    cut = end.track(view.owned["cut-a"])
    busy = end.track(view.owned["busy-b"])
    pool = PendingPool(1000, 1 << 20)
    _event(busy, pool, [UNTIL_MS - 9], 20, lag_ms=5000)
    _event(cut, pool, [UNTIL_MS - 1], 10, lag_ms=week_ms)

    def lag(shard_id: str) -> float | None:
        return METRICS.registry.get_sample_value("efo_shard_lag_seconds", {"stream": "", "shard_id": shard_id})

    assert lag("cut-a") == week_ms / 1000 and end.snapshot()["max_lag_ms"] == week_ms
    _event(cut, pool, [UNTIL_MS, UNTIL_MS + 1], 11, lag_ms=week_ms - 1)  # the cut
    assert cut.state is BoundState.CUT
    assert lag("cut-a") is None, "the cut shard's lag stays in efo_shard_lag_seconds"
    assert end.snapshot()["max_lag_ms"] == 5000, "the cut shard's lag stays the slowest"
    cut.owned.series.event(week_ms - 2)  # an event still in flight when reading stopped
    assert lag("cut-a") is None


def test_a_cut_chunk_is_cut_at_one_record_in_every_column_and_its_budget_comes_back() -> None:
    """The cut slices the data, counts its bytes, and cuts errors and dead letters at the same record."""
    from efo.kinesis.kpl import DeadLetter

    bound, handoff, pool = _bound()
    payloads = [b"a", b"bcd", b"efghij"]
    chunk = RecordChunk("s", bound.shard_id, serial=0, epoch=1)
    chunk.sequence_numbers = ["10", "11", "12"]
    chunk.sub_sequence_numbers = [None, None, None]
    chunk.partition_keys = ["k0", "k1", "k2"]
    chunk.explicit_hash_keys = [None, None, None]
    chunk.arrival_ms = [UNTIL_MS - 2, UNTIL_MS - 1, UNTIL_MS]
    chunk.data = payloads
    chunk.errors = [None, "bad", None]
    chunk.data_bytes = 10
    chunk.dead_letters = [DeadLetter(seq, "k", UNTIL_MS - 1, b"x", "corrupt") for seq in ("11", "12")]
    chunk.grant = pool.try_acquire(len(chunk), chunk.data_bytes)
    bound.owned.series.event(5)
    chunk.serial = bound.next_serial()
    bound.enqueued(chunk.serial, after("12"))
    bound.put(chunk)
    assert bound.state is BoundState.CUT
    (taken,) = handoff.take_batch(10_000, 1 << 30, 0.0, 0.0)
    assert taken.sequence_numbers == ["10", "11"] and taken.data == [b"a", b"bcd"]
    assert taken.errors == [None, "bad"] and taken.data_bytes == 4 and bound.bytes == 4
    assert [letter.sequence_number for letter in taken.dead_letters] == ["11"]
    # an event past the cut: dropped whole, its budget back
    later = RecordChunk("s", bound.shard_id, serial=bound.next_serial(), epoch=1)
    later.sequence_numbers, later.arrival_ms = ["13"], [UNTIL_MS + 1]
    later.sub_sequence_numbers, later.partition_keys, later.explicit_hash_keys = [None], ["k"], [None]
    later.data, later.errors = [b"xy"], [None]
    later.data_bytes = 2
    later.grant = pool.try_acquire(1, 2)
    bound.enqueued(later.serial, after("13"))
    bound.put(later)
    assert later.grant is None and len(later) == 0 and later.data_bytes == 0


def test_a_parent_whose_finished_lease_was_deleted_does_not_keep_the_run_from_ending() -> None:
    """p is still listed (within its retention), but its lease was deleted once its children began
    (efo.leases.cleanup): it has nothing left to read, so the run is done once c is caught up."""
    clock = Clock()
    view = View(clock)
    end = view.run_end()
    view.graph = ShardGraph.of([Shard("p", (), 0, 10), Shard("c", ("p",), 0, 10)])
    view.owned["c"] = _owned("c")
    _caught_up(end, view.owned["c"])
    clock.t += 1
    view.table(Lease("c", ("p",), "me", 1, Position("AFTER_SEQUENCE_NUMBER", "5")))
    assert end.done()
