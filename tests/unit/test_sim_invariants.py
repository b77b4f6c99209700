"""The simulation's invariants alone: each one fails on the history that breaks it, with the seed, the
invariant and the events that led there."""

from __future__ import annotations

from typing import Any

import pytest

from efo.sim.clock import ManualClock
from efo.sim.invariants import Oracle, Trace, Violation
from efo.sim.kinesis import SimStream

SHARD = "shardId-000000000000"


def _oracle(reads: bool = False) -> tuple[Oracle, SimStream, list[int]]:
    stream = SimStream("s", 1, clock=ManualClock())
    sequences = [stream.put("k", b"x")[1] for _ in range(4)]
    trace = Trace()
    trace.add(1.0, "w1", "shard.started", shard_id=SHARD)
    oracle = Oracle(42, stream, trace, failover_s=10.0, reads=lambda worker, shard, counter: reads)
    return oracle, stream, sequences


def _row(owner: str | None, counter: int, kind: str, sequence: int | None = None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "sk": {"S": f"shard|{SHARD}"},
        "lease_counter": {"N": str(counter)},
        "position_kind": {"S": kind},
    }
    if owner is not None:
        row["lease_owner"] = {"S": owner}
    if sequence is not None:
        row["sequence_number"] = {"S": str(sequence)}
    return {**row, **extra}


def test_a_checkpoint_past_records_no_sink_committed_is_a_skip() -> None:
    oracle, _, sequences = _oracle()
    oracle.committed(SHARD, [str(sequences[0])])
    oracle.row_changed(
        2.0, "w1", _row("w1", 1, "TRIM_HORIZON"), _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[0]), {}
    )
    with pytest.raises(Violation) as found:
        oracle.row_changed(
            3.0,
            "w1",
            _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[0]),
            _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[2]),
            {},
        )
    violation = found.value
    assert violation.seed == 42 and violation.invariant == "nothing skipped"
    assert "2 record(s)" in violation.detail and any("shard.started" in event for event in violation.trace)
    assert "seed 42" in violation.report() and "shard.started" in violation.report()


def test_a_checkpoint_that_moves_back_is_refused_unless_a_reset_moved_it() -> None:
    oracle, _, sequences = _oracle()
    oracle.committed(SHARD, [str(s) for s in sequences])
    ahead, behind = (
        _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[2]),
        _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[0]),
    )
    oracle.row_changed(2.0, "w1", _row("w1", 1, "TRIM_HORIZON"), ahead, {})
    oracle.row_changed(3.0, "w1", {**ahead, "reset_id": {"S": "r"}}, behind, {})  # an operator's reset
    with pytest.raises(Violation, match="monotonic"):
        oracle.row_changed(4.0, "w1", ahead, behind, {})


def test_a_checkpoint_written_by_a_worker_that_does_not_own_the_lease_is_unfenced() -> None:
    oracle, _, sequences = _oracle()
    oracle.committed(SHARD, [str(s) for s in sequences])
    with pytest.raises(Violation, match="fenced"):
        oracle.row_changed(
            2.0, "w2", _row("w1", 1, "TRIM_HORIZON"), _row("w1", 1, "AFTER_SEQUENCE_NUMBER", sequences[0]), {}
        )


def test_a_lease_taken_from_a_worker_that_reads_it_is_a_false_death_unless_asked_for() -> None:
    oracle, _, _ = _oracle(reads=True)
    asked = _row("w1", 1, "TRIM_HORIZON", wanted_by={"S": "w2"})
    oracle.row_changed(2.0, "w2", asked, _row("w2", 2, "TRIM_HORIZON"), {})
    with pytest.raises(Violation, match="no false death"):
        oracle.row_changed(3.0, "w3", _row("w1", 1, "TRIM_HORIZON"), _row("w3", 2, "TRIM_HORIZON"), {})


def test_a_child_subscribed_before_its_parent_ended_breaks_parents_first() -> None:
    oracle, stream, _ = _oracle()
    low, _high = stream.split(SHARD)
    with pytest.raises(Violation, match="parents first"):
        oracle.subscribing(2.0, "w1", low, {SHARD: _row("w1", 1, "AFTER_SEQUENCE_NUMBER", 1)})
    oracle.subscribing(3.0, "w1", low, {SHARD: _row(None, 2, "SHARD_END")})


def test_a_shard_its_owner_died_with_must_be_read_again_within_failover_plus_two_seconds() -> None:
    oracle, _, _ = _oracle()
    oracle.died(100.0, {SHARD}, "w1")
    with pytest.raises(Violation, match="read again"):
        oracle.first_event(112.5, SHARD)
    oracle, _, _ = _oracle()
    oracle.died(100.0, {SHARD}, "w1")
    oracle.first_event(111.5, SHARD)
    assert oracle.takeovers == [11.5]


def test_a_paused_worker_s_shards_are_read_again_within_failover_plus_two_seconds_of_the_pause() -> None:
    """A zombie (paused past its failover): its shards are its death's, timed from the pause, not
    from its end (which excused every takeover of the pause before)."""
    oracle, _, _ = _oracle()
    oracle.disturbed(170.0, delays_reading=False)
    oracle.died(150.0, {SHARD}, "w1")
    with pytest.raises(Violation, match="read again"):
        oracle.first_event(162.5, SHARD)


def test_after_the_start_or_a_fault_the_fleet_has_thirty_seconds_to_read_every_shard_again() -> None:
    oracle, _, _ = _oracle()
    oracle.died(10.0, {SHARD}, "w1")
    oracle.first_event(35.0, SHARD)  # a death during the start's convergence
    oracle.disturbed(200.0, delays_reading=True)
    oracle.died(205.0, {SHARD}, "w1")
    oracle.first_event(229.0, SHARD)
    with pytest.raises(Violation, match="read again"):
        oracle.died(300.0, {SHARD}, "w1")
        oracle.first_event(313.0, SHARD)


def test_a_shard_taken_over_and_left_unread_by_a_second_death_is_timed_from_the_second() -> None:
    """w2 took over a shard of w1's death and died before its first event: the shard is w2's death's
    to take over. Not so for a worker that dies twice (a zombie killed in its pause): its shards stay
    timed from the first."""
    oracle, _, _ = _oracle()
    oracle.died(100.0, {SHARD}, "w1")
    oracle.died(108.0, {SHARD}, "w2")
    oracle.first_event(118.0, SHARD)
    assert oracle.takeovers == [10.0]
    oracle, _, _ = _oracle()
    oracle.died(100.0, {SHARD}, "w1")
    oracle.died(108.0, {SHARD}, "w1")
    with pytest.raises(Violation, match="read again"):
        oracle.first_event(118.0, SHARD)
