"""The checkpoint ledger of one claim (what to checkpoint, when), the claim's phases, and the
coordinator's first-start positions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from efo.config import InitialPosition
from efo.kinesis.graph import Shard, ShardGraph
from efo.leases.ledger import CheckpointLedger
from efo.leases.lifecycle import TRANSITIONS, Commit, IllegalTransition, OwnedShard, ShardPhase
from efo.leases.model import Lease
from efo.pipeline.records import SHARD_END, Position, after
from efo.worker.shardsync import first_start_position

STAMP = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def _enqueue(ledger: CheckpointLedger, *resumes: str) -> list[int]:
    serials = []
    for resume in resumes:
        serial = ledger.next_serial()
        ledger.enqueued(serial, after(resume))
        serials.append(serial)
    return serials


def _owned(epoch: int = 1, checkpoint: Position | None = None) -> OwnedShard:
    lease = Lease("shard-0", (), "me", epoch, checkpoint or Position("TRIM_HORIZON"))
    return OwnedShard.claim(lease, "me", lambda owned: None)


# ---- serials and commits ----------------------------------------------------------------


def test_next_serial_increases_from_one() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    assert [ledger.next_serial() for _ in range(3)] == [1, 2, 3]


def test_a_commit_makes_the_resume_position_of_that_chunk_due() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20", "30")
    ledger.committed(1, 4)
    assert ledger.due == after("10")
    assert ledger.outstanding == 2


def test_an_out_of_order_commit_waits_for_the_earlier_chunks() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20", "30")
    ledger.committed(2, 7)
    assert ledger.due is None, "chunk 1 is not committed: nothing may be checkpointed"
    ledger.committed(1, 4)
    assert ledger.due == after("20")
    assert ledger.uncheckpointed_records == 11


def test_a_repeated_commit_counts_once_and_never_moves_the_checkpoint_back() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20")
    ledger.committed(1, 2)
    ledger.committed(2, 2)
    ledger.committed(1, 2)
    assert ledger.due == after("20")
    assert ledger.uncheckpointed_records == 4


def test_nothing_is_due_before_any_commit() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10")
    assert ledger.due is None


def test_a_written_checkpoint_is_not_due_again_and_later_commits_stay_counted() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20")
    ledger.committed(1, 3)
    due, counted = ledger.due, ledger.uncheckpointed_records
    ledger.committed(2, 5)  # lands while the write is under way
    assert due is not None
    ledger.wrote(due, counted)
    assert ledger.written == after("10")
    assert ledger.uncheckpointed_records == 5
    assert ledger.due == after("20")


# ---- idle -------------------------------------------------------------------------------


def test_idle_with_outstanding_chunks_moves_the_resume_position_of_the_last_chunk() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20")
    ledger.idle(after("25"))
    assert ledger.due is None  # not committed yet: nothing may be checkpointed
    ledger.committed(1, 1)
    assert ledger.due == after("10")
    ledger.committed(2, 1)
    assert ledger.due == after("25")


def test_an_idle_shard_with_nothing_committed_has_nothing_due_however_far_the_continuation_moves() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    ledger.started(after("40"))
    for continuation in ("40", "41", "42"):
        ledger.idle(after(continuation))
        assert ledger.due is None, "an empty event's continuation alone is never a reason to write"
    assert not ledger.urgent and ledger.uncheckpointed_records == 0


def test_an_idle_shard_whose_checkpoint_is_written_has_nothing_due_however_far_the_continuation_moves() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10")
    ledger.committed(1, 3)
    ledger.wrote(after("10"), 3)
    for continuation in ("40", "45"):
        ledger.idle(after(continuation))
        assert ledger.due is None, "no record lies between the written checkpoint and the continuation"
    assert ledger.written == after("10") and ledger.uncheckpointed_records == 0


def test_an_idle_shard_writes_its_pin_and_nothing_after_it() -> None:
    ledger = CheckpointLedger(Position("LATEST"))
    ledger.started(after("100"))
    assert ledger.due == after("100") and ledger.urgent
    ledger.idle(after("101"))  # the next empty event, before the pin is written
    pin = ledger.due
    assert pin is not None
    ledger.wrote(pin, 0)
    ledger.idle(after("102"))
    assert ledger.due is None and not ledger.urgent


def test_an_empty_event_during_a_checkpoint_write_makes_nothing_due_after_it() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10")
    ledger.committed(1, 2)
    due, counted = ledger.due, ledger.uncheckpointed_records
    assert due == after("10")
    ledger.idle(after("40"))  # lands while the write is under way
    ledger.wrote(due, counted)
    assert ledger.due is None
    assert ledger.uncheckpointed_records == 0


def test_a_committed_chunk_is_still_due_after_empty_events_and_records_after_them_are_due_again() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10")
    ledger.committed(1, 2)
    ledger.idle(after("40"))
    due = ledger.due
    assert due is not None, "records were committed: their position must be written"
    ledger.wrote(due, 2)
    _enqueue(ledger, "50")
    ledger.idle(after("55"))
    ledger.committed(2, 1)
    assert ledger.due == after("55")
    assert ledger.uncheckpointed_records == 1


# ---- started: the pin of LATEST and AT_TIMESTAMP -----------------------------------------


@pytest.mark.parametrize(
    "start", [Position("LATEST"), Position("AT_TIMESTAMP", timestamp=STAMP)], ids=["LATEST", "AT_TIMESTAMP"]
)
def test_started_pins_latest_and_at_timestamp_at_once(start: Position) -> None:
    ledger = CheckpointLedger(start)
    ledger.started(Position("AT_SEQUENCE_NUMBER", "100"))
    assert ledger.due == Position("AT_SEQUENCE_NUMBER", "100")
    assert ledger.urgent


@pytest.mark.parametrize(
    "start",
    [Position("TRIM_HORIZON"), after("5"), Position("AT_SEQUENCE_NUMBER", "5"), Position("AT_SEQUENCE_NUMBER", "5", 3)],
    ids=["TRIM_HORIZON", "AFTER", "AT", "AT-sub"],
)
def test_started_does_not_pin_trim_horizon_or_sequence_number_starts(start: Position) -> None:
    ledger = CheckpointLedger(start)
    ledger.started(Position("AT_SEQUENCE_NUMBER", "100"))
    assert ledger.due is None
    assert not ledger.urgent


def test_started_does_not_overwrite_a_position_already_safe() -> None:
    ledger = CheckpointLedger(Position("LATEST"))
    _enqueue(ledger, "50")
    ledger.committed(1, 1)
    ledger.started(Position("AT_SEQUENCE_NUMBER", "40"))
    assert ledger.due == after("50")


# ---- shard end --------------------------------------------------------------------------


def test_shard_end_is_due_only_once_the_last_chunk_is_committed() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    _enqueue(ledger, "10", "20")
    ledger.ended()
    assert ledger.due is None
    ledger.committed(1, 1)
    assert ledger.due == after("10")
    ledger.committed(2, 1)
    assert ledger.due == SHARD_END and ledger.urgent
    ledger.wrote(SHARD_END, 2)
    assert ledger.finished and ledger.due is None and not ledger.urgent


def test_a_shard_that_ends_with_nothing_outstanding_is_due_for_shard_end_at_once() -> None:
    ledger = CheckpointLedger(Position("TRIM_HORIZON"))
    ledger.ended()
    assert ledger.due == SHARD_END


# ---- claims: phases and epochs -----------------------------------------------------------


def test_a_claim_carries_the_lease_counter_as_its_epoch_and_starts_subscribing() -> None:
    owned = _owned(epoch=7)
    assert owned.epoch == 7 and owned.phase is ShardPhase.SUBSCRIBING
    assert owned.ledger.start == Position("TRIM_HORIZON")


def test_a_late_commit_of_an_earlier_claim_never_moves_the_new_claims_checkpoint() -> None:
    # Claim 1 handed on serials 1 and 2 (records up to 20); the shard was released and claimed again
    # from after(10) as claim 3, which handed on serials 1 (records 11-20) and 2 (records 21-30).
    owned = _owned(epoch=3, checkpoint=after("10"))
    _enqueue(owned.ledger, "20", "30")
    assert not owned.committed(Commit("shard-0", epoch=1, serial=2, records=10))
    assert owned.ledger.due is None, "a commit of claim 1 moved claim 3's checkpoint past uncommitted records"
    assert owned.committed(Commit("shard-0", epoch=3, serial=1, records=10))
    assert owned.ledger.due == after("20")


@pytest.mark.parametrize("phase", list(ShardPhase))
def test_every_phase_change_outside_the_diagram_raises(phase: ShardPhase) -> None:
    for target in ShardPhase:
        owned = _owned()
        owned.phase = phase
        if target is phase or target in TRANSITIONS[phase]:
            owned.enter(target)
            assert owned.phase is target
        else:
            with pytest.raises(IllegalTransition, match=f"{phase.name} -> {target.name}"):
                owned.enter(target)


def test_terminal_phases_accept_no_commit_and_have_no_way_out() -> None:
    for phase in (ShardPhase.ENDED, ShardPhase.RELEASED, ShardPhase.LOST):
        assert phase.terminal and not TRANSITIONS[phase]
        owned = _owned()
        _enqueue(owned.ledger, "10")
        owned.phase = phase
        assert not owned.committed(Commit("shard-0", 1, 1, 1))


def test_the_first_reading_phase_marks_the_first_event() -> None:
    seen: list[ShardPhase] = []
    lease = Lease("shard-0", (), "me", 1, Position("LATEST"))
    owned = OwnedShard.claim(lease, "me", lambda o: seen.append(o.phase))
    assert not owned.first_event
    owned.enter(ShardPhase.READING)
    owned.enter(ShardPhase.SUBSCRIBING)
    assert owned.first_event
    assert seen == [ShardPhase.READING, ShardPhase.SUBSCRIBING]


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


def test_latest_first_start_skips_closed_shards_and_starts_open_ones_at_the_moment_of_the_first_start() -> None:
    graph = _split_and_merge()
    positions = {sid: first_start_position(InitialPosition("LATEST"), graph, sid, STAMP) for sid in graph.shards}
    assert positions == {
        "shard-0": SHARD_END,
        "shard-1": SHARD_END,
        "shard-2": SHARD_END,
        "shard-3": Position("AT_TIMESTAMP", timestamp=STAMP),
        "shard-9": Position("AT_TIMESTAMP", timestamp=STAMP),
    }


def test_trim_horizon_first_start_reads_every_shard_from_its_beginning() -> None:
    graph = _split_and_merge()
    for sid in graph.shards:
        assert first_start_position(InitialPosition("TRIM_HORIZON"), graph, sid, STAMP) == Position("TRIM_HORIZON")


def test_at_timestamp_first_start_applies_the_timestamp_to_open_and_closed_shards() -> None:
    graph = _split_and_merge()
    initial = InitialPosition("AT_TIMESTAMP", STAMP)
    for sid in graph.shards:
        position = first_start_position(initial, graph, sid, STAMP)
        assert position == Position("AT_TIMESTAMP", timestamp=STAMP)
        assert position.starting_position() == {"Type": "AT_TIMESTAMP", "Timestamp": STAMP}
