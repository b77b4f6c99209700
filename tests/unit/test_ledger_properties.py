"""A stateful property test of one shard's checkpoints across claims.

Hypothesis drives a shard (records put, the shard closed) and a worker's claims of it: records
handed on in chunks, events without records, the end of the shard, commits by the sink in any
order (also late ones, of earlier claims), checkpoint writes, and the claim given up (released
with its checkpoint, or lost without one) and taken again. An event without records may move the
continuation past the last record (as AWS may on an idle shard); later records come after it. The
sink's commits are routed by claim epoch exactly as the coordinator routes them
(``OwnedShard.committed``).

Invariant: no checkpoint, written or due, ever passes a record that the sink has not committed;
SHARD_END only once every record is committed. And an event without records never makes a
checkpoint due where none was: an idle shard writes nothing. (Under LATEST, records written
before a claim that starts at LATEST are not expected: that is what LATEST means. A claim's first
event pins it to a sequence number, so after that no claim starts at LATEST again.)
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.model import Lease
from efo.pipeline.records import MAX_SUB_SEQUENCE, SHARD_END, Position, after

SHARD = "shard-0"


@dataclass
class Chunk:
    epoch: int
    serial: int
    sequences: list[int]


class ShardCheckpoints(RuleBasedStateMachine):
    @initialize(latest=st.booleans(), already=st.integers(0, 3))
    def start(self, latest: bool, already: int) -> None:
        self.records: list[int] = list(range(1, already + 1))  # sequence numbers in the shard
        self.floor = 0  # the newest continuation an event without records carried: later records come after it
        self.closed = False
        self.committed: set[int] = set()
        self.in_flight: list[Chunk] = []
        self.table: Position = Position("LATEST") if latest else Position("TRIM_HORIZON")
        self.not_expected: set[int] = set()  # written before a claim that started at LATEST
        self.epoch = 0
        self.owned: OwnedShard | None = None
        self._claim()

    def _claim(self) -> None:
        self.epoch += 2  # the take, and the release or the other worker's take before it
        self.owned = OwnedShard.claim(Lease(SHARD, (), "me", self.epoch, self.table), "me", lambda owned: None)
        self.first_seen = False
        if self.table.kind == "LATEST":  # until the first event pins it, a claim starts from "now"
            self.not_expected.update(self.records)
            self.read_after = self.records[-1] if self.records else 0
        else:
            delivered = self.table.delivered_through()
            self.read_after = 0 if delivered is None else delivered[0]

    # ---- the shard ---------------------------------------------------------------------------

    @precondition(lambda self: not self.closed)
    @rule(count=st.integers(1, 5))
    def put(self, count: int) -> None:
        last = max(self.records[-1] if self.records else 0, self.floor)
        self.records.extend(range(last + 1, last + 1 + count))

    @precondition(lambda self: not self.closed and len(self.records) >= 6)
    @rule()
    def close(self) -> None:
        self.closed = True

    # ---- the subscription of the current claim --------------------------------------------------

    def _unread(self) -> list[int]:
        return [seq for seq in self.records if seq > self.read_after]

    def _first(self, position: Position) -> None:
        assert self.owned is not None
        if not self.first_seen:
            self.first_seen = True
            self.owned.ledger.started(position)

    @precondition(lambda self: self.owned is not None and self.owned.phase.reading)
    @rule(sizes=st.lists(st.integers(1, 2), min_size=1, max_size=3))
    def hand_on(self, sizes: list[int]) -> None:
        """One event per size: its records are handed on as one chunk."""
        assert self.owned is not None
        for size in sizes:
            sequences = self._unread()[:size]
            if not sequences:
                return
            self._first(Position("AT_SEQUENCE_NUMBER", str(sequences[0])))
            serial = self.owned.ledger.next_serial()
            self.owned.ledger.enqueued(serial, after(str(sequences[-1])))
            self.in_flight.append(Chunk(self.owned.epoch, serial, sequences))
            self.read_after = sequences[-1]

    @precondition(lambda self: self.owned is not None and self.owned.phase.reading)
    @rule()
    def event_without_records(self) -> None:
        assert self.owned is not None
        if self._unread() or not self.records:
            return
        self.floor = max(self.floor, self.records[-1]) + 1  # the server moved the continuation on
        continuation = after(str(self.floor))
        self._first(continuation)
        before = self.owned.ledger.due
        self.owned.ledger.idle(continuation)
        if before is None:
            assert self.owned.ledger.due is None, f"an event without records made {self.owned.ledger.due} due"

    @precondition(lambda self: self.owned is not None and self.owned.phase.reading and self.closed)
    @rule()
    def shard_end(self) -> None:
        assert self.owned is not None
        if self._unread():
            return
        self.owned.enter(ShardPhase.DRAINING)
        self.owned.ledger.ended()

    # ---- checkpoints and the claim's end ---------------------------------------------------------

    @precondition(lambda self: self.owned is not None)
    @rule()
    def write_checkpoint(self) -> None:
        assert self.owned is not None
        due = self.owned.ledger.due
        if due is None:
            return
        self.table = due
        self.owned.ledger.wrote(due, self.owned.ledger.uncheckpointed_records)
        if due == SHARD_END:
            self.owned.enter(ShardPhase.ENDED)
            self.owned = None

    @precondition(lambda self: self.owned is not None)
    @rule(lost=st.booleans())
    def claim_again(self, lost: bool) -> None:
        """A failover and back, a reset, a rebalance: the claim ends (released with its checkpoint,
        or lost without writing one) and the shard is claimed again from what the table holds."""
        assert self.owned is not None
        if lost:
            self.owned.enter(ShardPhase.LOST)
        else:
            self.write_checkpoint()
            if self.owned is None:  # that was SHARD_END
                return
            self.owned.enter(ShardPhase.RELEASING)
            self.owned.enter(ShardPhase.RELEASED)
        self._claim()

    # ---- the sink ------------------------------------------------------------------------------

    @precondition(lambda self: bool(self.in_flight))
    @rule(picks=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=3), then_write=st.booleans())
    def commit(self, picks: list[int], then_write: bool) -> None:
        """The sink commits some chunks, in any order, of this claim or of earlier ones."""
        for pick in picks:
            if not self.in_flight:
                break
            chunk = self.in_flight.pop(pick % len(self.in_flight))
            self.committed.update(chunk.sequences)
            if self.owned is not None:
                self.owned.committed(Commit(SHARD, chunk.epoch, chunk.serial, len(chunk.sequences)))
        if then_write and self.owned is not None:
            self.write_checkpoint()

    @precondition(lambda self: bool(self.in_flight))
    @rule()
    def drop_uncommitted(self) -> None:
        """A batch that never reached the sink (a crash, a shutdown): its chunk is never committed."""
        self.in_flight.pop(0)

    @precondition(lambda self: self.owned is None and not self.in_flight)
    @rule()
    def finished(self) -> None:
        """Nothing is left to do once the shard is finished and the sink has everything."""

    # ---- the invariant ---------------------------------------------------------------------------

    def _skipped_by(self, position: Position) -> list[int]:
        """Records a restart from ``position`` would never read again."""
        if position == SHARD_END:
            return list(self.records)
        through = position.delivered_through()
        if through is None:
            return []
        return [seq for seq in self.records if (seq, MAX_SUB_SEQUENCE) <= through]

    def _assert_safe(self, position: Position, what: str) -> None:
        lost = [s for s in self._skipped_by(position) if s not in self.committed and s not in self.not_expected]
        assert not lost, f"{what} {position} passes records the sink never committed: {lost}"

    @invariant()
    def no_checkpoint_passes_an_uncommitted_record(self) -> None:
        self._assert_safe(self.table, "the written checkpoint")
        if self.owned is not None and self.owned.ledger.due is not None:
            self._assert_safe(self.owned.ledger.due, "the due checkpoint")


ShardCheckpoints.TestCase.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
test_no_checkpoint_ever_passes_an_uncommitted_record = ShardCheckpoints.TestCase
