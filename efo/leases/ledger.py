"""One claim's checkpoint ledger: the chunks handed on, in order, and the one rule for checkpoints.

**The checkpoint is the last position whose records were all committed by the sink** (in this
claim). Chunks are numbered by serial as the subscription hands them on; a commit marks one
chunk; the committed prefix moves the safe position forward to the resume position of its last
chunk. When the shard has ended and its last chunk is committed, the safe position is
:data:`~efo.pipeline.records.SHARD_END`.

**An idle shard writes nothing.** Only three things make a checkpoint due: the pin of a start
that names no record (LATEST, AT_TIMESTAMP: :meth:`CheckpointLedger.started`), records committed
past the written checkpoint, and SHARD_END. An event without records that moved the continuation
is never a reason to write: with chunks outstanding, it moves the resume position of the last one
(written when that chunk's commit makes it due anyway); with none, it is dropped. That loses
nothing: no record lies between the safe position and the newer continuation, so a restart from
the older position reads only the same empty stretch again. Whether AWS moves the continuation of
an idle shard is not documented; if it does, writing it would cost one DynamoDB write per idle
shard per ``checkpoint.interval_s``. So what is due is never changed by an empty event, and the
writes of an idle fleet are its heartbeats alone (the ``lag_ms`` stored with the checkpoint is then
not refreshed either).

A ledger belongs to exactly one claim of a shard (one lease counter): commits of an earlier claim
never reach it (:meth:`efo.leases.lifecycle.OwnedShard.committed` routes by claim epoch). It is
the :class:`~efo.kinesis.subscription.ShardProgress` of its subscription. Loop-thread only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from efo.pipeline.records import SHARD_END, Position

#: Starting positions that name no record: they are pinned to the first event's position at once.
UNPINNED_KINDS = frozenset({"LATEST", "AT_TIMESTAMP"})


class RecordTally:
    """A running sum of several ledgers' :attr:`~CheckpointLedger.uncheckpointed_records` (a worker's
    backlog), kept as each changes: summing every held shard's after every write cost a tenth of a
    4,096-shard simulation."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        self.records = 0


@dataclass(slots=True)
class _Chunk:
    serial: int
    resume: Position  # where the shard resumes once this chunk and every earlier one is committed
    committed: bool = False
    records: int = 0


class CheckpointLedger:
    def __init__(self, start: Position) -> None:
        assert start != SHARD_END, "a finished shard is never claimed"
        self.start = start
        self.written: Position = start  # in the table: what the claim started from, then each write
        self._safe: Position | None = None  # the newest position safe to write; None: nothing yet
        self._chunks: deque[_Chunk] = deque()
        self._serial = 0
        self._ended = False
        self.uncheckpointed_records = 0  # committed by the sink, not yet covered by a written checkpoint
        self.urgent = False  # write at once rather than at the next interval (a pin, SHARD_END)
        self._tally: RecordTally | None = None  # counts uncheckpointed_records too, while set

    def count_in(self, tally: RecordTally | None) -> None:
        """From now on ``tally`` counts this ledger's uncheckpointed records (None: no tally)."""
        if self._tally is not None:
            self._tally.records -= self.uncheckpointed_records
        self._tally = tally
        if tally is not None:
            tally.records += self.uncheckpointed_records

    # ---- the subscription's side (ShardProgress) ---------------------------------------------

    def next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def started(self, first: Position) -> None:
        """The first event arrived; ``first`` is a concrete position at or before its first record.
        LATEST and AT_TIMESTAMP are pinned to it at once, so no later start applies them again."""
        assert first.is_concrete, first
        if self.start.kind in UNPINNED_KINDS and self._safe is None:
            self._safe = first
            self.urgent = True

    def enqueued(self, serial: int, resume: Position) -> None:
        assert not self._ended and serial == self._serial, (serial, self._serial)
        self._chunks.append(_Chunk(serial, resume))

    def idle(self, resume: Position) -> None:
        """An event without records moved the continuation to ``resume``: the last chunk outstanding
        resumes there once committed; with none outstanding it is no reason to write (nothing lies
        between the safe position and ``resume``), and it is dropped."""
        assert not self._ended
        if self._chunks:
            self._chunks[-1].resume = resume

    def ended(self) -> None:
        """The shard's last event was handed on; SHARD_END is safe once everything is committed."""
        self._ended = True
        self._advance()

    # ---- the sink's side ------------------------------------------------------------------------

    def committed(self, serial: int, records: int) -> None:
        """The sink committed the chunk ``serial`` of this claim (in any order, at most once each)."""
        for chunk in self._chunks:
            if chunk.serial == serial:
                if not chunk.committed:
                    chunk.committed = True
                    chunk.records = records
                break
        self._advance()

    def _advance(self) -> None:
        while self._chunks and self._chunks[0].committed:
            chunk = self._chunks.popleft()
            self._safe = chunk.resume
            self.uncheckpointed_records += chunk.records
            if self._tally is not None:
                self._tally.records += chunk.records
        if self._ended and not self._chunks and self._safe != SHARD_END:
            self._safe = SHARD_END
            self.urgent = True

    # ---- the checkpoint writer's side -------------------------------------------------------------

    @property
    def due(self) -> Position | None:
        """The checkpoint to write now, or None when the table already has it."""
        if self._safe is None or self._safe == self.written:
            return None
        return self._safe

    def wrote(self, position: Position, records: int) -> None:
        """``position`` is in the table now; it covered ``records`` committed records (the count
        read with :attr:`uncheckpointed_records` before the write: later commits stay counted)."""
        self.written = position
        self.uncheckpointed_records -= records
        if self._tally is not None:
            self._tally.records -= records
        assert self.uncheckpointed_records >= 0, "a claim's writes overlapped (they go one at a time)"
        if self.due is None:
            self.urgent = False

    @property
    def outstanding(self) -> int:
        """Chunks handed on and not yet committed."""
        return len(self._chunks)

    @property
    def finished(self) -> bool:
        """SHARD_END is in the table."""
        return self.written == SHARD_END
