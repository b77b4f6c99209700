"""ShardState bookkeeping (what to checkpoint, when) and the first-start positions of the coordinator."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from efo.config import InitialPosition
from efo.coordinator import Coordinator, ShardState
from efo.kinesis.shards import Shard, ShardGraph
from efo.kinesis.subscription import ShardEnded
from efo.leases.table import Lease
from efo.pipeline.records import Position, after

STAMP = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def _state(checkpoint: Position | None = None) -> ShardState:
    lease = Lease(
        "shard-0", (), "worker-1", 1, checkpoint if checkpoint is not None else Position("TRIM_HORIZON"), False
    )
    return ShardState(lease)


def _enqueue(state: ShardState, *resumes: str) -> list[int]:
    serials = []
    for resume in resumes:
        serial = state.next_serial()
        state.enqueued(serial, after(resume))
        serials.append(serial)
    return serials


# ---- serials and commits ----------------------------------------------------------------


def test_next_serial_increases_from_one() -> None:
    state = _state()
    assert [state.next_serial() for _ in range(3)] == [1, 2, 3]


def test_committed_moves_checkpoint_due_to_the_resume_position_of_that_serial() -> None:
    state = _state()
    _enqueue(state, "10", "20", "30")
    state.committed(1, 4)
    assert state.checkpoint_due == after("10")
    assert [serial for serial, _ in state.outstanding] == [2, 3]


def test_committed_with_a_higher_serial_covers_all_earlier_chunks() -> None:
    state = _state()
    _enqueue(state, "10", "20", "30")
    state.committed(2, 7)
    assert state.checkpoint_due == after("20")
    assert list(state.outstanding) == [(3, after("30"))]


def test_committed_counts_records_awaiting_their_checkpoint() -> None:
    state = _state()
    _enqueue(state, "10", "20")
    state.committed(1, 4)
    state.committed(2, 6)
    assert state.uncheckpointed_records == 10
    assert state.checkpoint_due == after("20")
    assert not state.outstanding


def test_a_repeated_or_stale_commit_does_not_move_checkpoint_due_backwards() -> None:
    state = _state()
    _enqueue(state, "10", "20")
    state.committed(2, 2)
    state.committed(1, 0)
    assert state.checkpoint_due == after("20")


def test_nothing_is_due_before_any_commit() -> None:
    state = _state()
    _enqueue(state, "10")
    assert state.checkpoint_due is None


# ---- idle -------------------------------------------------------------------------------


def test_idle_with_outstanding_chunks_moves_the_resume_position_of_the_last_chunk() -> None:
    state = _state()
    _enqueue(state, "10", "20")
    state.idle(after("25"))
    assert list(state.outstanding) == [(1, after("10")), (2, after("25"))]
    assert state.checkpoint_due is None  # not committed yet: nothing may be checkpointed
    state.committed(2, 1)
    assert state.checkpoint_due == after("25")


def test_idle_without_outstanding_chunks_makes_the_continuation_due_at_once() -> None:
    state = _state()
    _enqueue(state, "10")
    state.committed(1, 1)
    state.idle(after("40"))
    assert state.checkpoint_due == after("40")
    state.idle(after("45"))
    assert state.checkpoint_due == after("45")


# ---- started ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start", [Position("LATEST"), Position("AT_TIMESTAMP", timestamp=STAMP)], ids=["LATEST", "AT_TIMESTAMP"]
)
def test_started_pins_latest_and_at_timestamp_leases_urgently(start: Position) -> None:
    state = _state(start)
    seen: list[bool] = []
    state.on_progress = lambda s: seen.append(s.urgent)
    state.started(Position("AT_SEQUENCE_NUMBER", "100"))
    assert state.first_event
    assert state.checkpoint_due == Position("AT_SEQUENCE_NUMBER", "100")
    assert state.urgent
    assert seen == [True]  # the coordinator is told, with the urgency already set


@pytest.mark.parametrize(
    "start",
    [Position("TRIM_HORIZON"), after("5"), Position("AT_SEQUENCE_NUMBER", "5"), Position("AT_SEQUENCE_NUMBER", "5", 3)],
    ids=["TRIM_HORIZON", "AFTER", "AT", "AT-sub"],
)
def test_started_does_not_pin_trim_horizon_or_sequence_number_starts(start: Position) -> None:
    state = _state(start)
    seen: list[ShardState] = []
    state.on_progress = seen.append
    state.started(Position("AT_SEQUENCE_NUMBER", "100"))
    assert state.first_event
    assert state.checkpoint_due is None
    assert not state.urgent
    assert seen == [state]


def test_started_does_not_overwrite_a_checkpoint_already_due() -> None:
    state = _state(Position("LATEST"))
    state.checkpoint_due = after("50")
    state.started(Position("AT_SEQUENCE_NUMBER", "40"))
    assert state.checkpoint_due == after("50")
    assert not state.urgent


# ---- drained ----------------------------------------------------------------------------


def test_drained_only_once_ended_and_nothing_is_outstanding() -> None:
    state = _state()
    _enqueue(state, "10", "20")
    assert not state.drained
    state.ended = ShardEnded(("shard-1",))
    assert not state.drained  # the last records are not committed yet
    state.committed(1, 1)
    assert not state.drained
    state.committed(2, 1)
    assert state.drained


def test_not_drained_while_running_even_with_nothing_outstanding() -> None:
    state = _state()
    assert not state.drained
    _enqueue(state, "10")
    state.committed(1, 1)
    assert not state.drained


# ---- first-start positions --------------------------------------------------------------


def _split_and_merge() -> ShardGraph:
    # shard-0 split into 1 and 2; 1 and 2 later merged into 3; shard-9 untouched.
    return ShardGraph.of(
        [
            Shard("shard-0", (), 0, 99),
            Shard("shard-1", ("shard-0",), 0, 49),
            Shard("shard-2", ("shard-0",), 50, 99),
            Shard("shard-3", ("shard-1", "shard-2"), 0, 99),
            Shard("shard-9", (), 100, 199),
        ]
    )


def test_latest_first_start_skips_closed_shards_and_starts_open_ones_at_latest() -> None:
    graph = _split_and_merge()
    positions = {sid: Coordinator._first_start_position(InitialPosition("LATEST"), graph, sid) for sid in graph.shards}
    assert positions == {
        "shard-0": None,
        "shard-1": None,
        "shard-2": None,
        "shard-3": Position("LATEST"),
        "shard-9": Position("LATEST"),
    }


def test_trim_horizon_first_start_reads_every_shard_from_its_beginning() -> None:
    graph = _split_and_merge()
    for sid in graph.shards:
        assert Coordinator._first_start_position(InitialPosition("TRIM_HORIZON"), graph, sid) == Position(
            "TRIM_HORIZON"
        )


def test_at_timestamp_first_start_applies_the_timestamp_to_open_and_closed_shards() -> None:
    graph = _split_and_merge()
    initial = InitialPosition("AT_TIMESTAMP", STAMP)
    for sid in graph.shards:
        position = Coordinator._first_start_position(initial, graph, sid)
        assert position == Position("AT_TIMESTAMP", timestamp=STAMP)
        assert position is not None and position.starting_position() == {"Type": "AT_TIMESTAMP", "Timestamp": STAMP}
