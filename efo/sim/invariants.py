"""What must hold in every simulated run, checked as it happens, and the trail that explains a failure.

Checked at every change of a lease row (the simulated DynamoDB reports each one as it lands):

- **fenced**: a checkpoint moves only by a write of the worker that owns the lease, under the lease
  counter it holds (or an operator's reset);
- **monotonic**: a shard's checkpoint never moves backwards (only a reset may move it back);
- **nothing skipped**: when a checkpoint lands, every record of the shard before it was committed
  by a sink (some worker's, some claim's): what lies behind a checkpoint is never read again;
- **parents first**: a subscription to a shard starts only once each of its parents is finished;
- **one lease a shard**: no shard's lease is written in a lease partition while it has one in
  another (a table whose layout grew: efo.leases.model.Layout; checked by the fleet, which sees
  every lease row);
- **finished stays finished**: a shard whose SHARD_END landed gets no new lease (after its lease was
  deleted) and no subscription (the simulation makes no operator resets);
- **no false death**: a lease goes straight from one owner to another only when the owner does not
  read the shard under that claim any more, or no longer trusts its leases (no heartbeat of its
  landed within the lease validity), or when the taker asked for it and waited ``failover_s``.

Checked every second by :meth:`Oracle.watch` (the fleet's monitor):

- **read again**: a shard that can be read (its lease not finished, its parents finished) is read by
  a live worker (or one stopping gracefully, whose driver commits what it reads on) within
  ``failover_s + 2 s`` of when it stopped being read (its owner died, stopped, handed it over, or it
  was born of a reshard), and within :data:`START_LIMIT_S` of the fleet's start
  or of the end of a fault that could delay it (DynamoDB's faults, a late or slow worker's: the fleet
  converges again as after a start); a paused worker's shards are its death's, from the pause;
- **no exit**: no worker's service ends on its own (a fault that heals never ends a worker);
- **no doubt**: no worker's leases go into doubt unless a fault touched its own DynamoDB path or time,
  or the whole table's;
- **balance**: 30 s after the last change of membership (a start, a join, a stop, a death) with no
  fault since, every shard is read by exactly one worker and their counts differ by at most one.

A violation raises :class:`Violation` with the seed, the invariant, and the last events of the
:class:`Trace` (the workers' own log events, the faults, the lease rows' changes).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from efo.leases.lifecycle import ShardPhase
from efo.sim.kinesis import SimShard, SimStream
from efo.worker.liveness import Trust

if TYPE_CHECKING:
    from efo.sim.fleet import Fleet

START_LIMIT_S = 30.0
BALANCE_AFTER_S = 30.0
TRACE_EVENTS = 60
READING = frozenset({ShardPhase.READING, ShardPhase.BACKPRESSURED, ShardPhase.DRAINING})


class Violation(BaseException):
    """A BaseException, so that no handler of the production code mistakes it for an AWS error."""

    def __init__(self, seed: int, at_s: float, invariant: str, detail: str, trace: list[str]) -> None:
        self.seed = seed
        self.at_s = at_s
        self.invariant = invariant
        self.detail = detail
        self.trace = trace
        self.fleet: list[str] = []  # each live worker's view, added by the run
        super().__init__(f"seed {seed}: invariant '{invariant}' violated at {at_s:.3f} s: {detail}")

    def report(self) -> str:
        lines = [f"seed {self.seed}: invariant '{self.invariant}' violated at {self.at_s:.3f} s: {self.detail}"]
        if self.fleet:
            lines.append("the fleet then:")
            lines += ["  " + line for line in self.fleet]
        lines.append(f"the last {len(self.trace)} events:")
        lines += ["  " + line for line in self.trace]
        return "\n".join(lines)


class Trace:
    """The last events of the run, each with its virtual time."""

    def __init__(self, size: int = 5000) -> None:
        self.events: deque[str] = deque(maxlen=size)

    def add(self, at_s: float, who: str, event: str, **fields: Any) -> None:
        details = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
        self.events.append(f"{at_s:10.3f} {who:<8} {event} {details}".rstrip())

    def last(self, count: int = TRACE_EVENTS, about: str | None = None) -> list[str]:
        """The last ``count`` events; with ``about`` (a shard or a worker), the last of those naming it
        first (marked ``>``), then the last of all."""
        events = list(self.events)
        if about is None:
            return events[-count:]
        named = [event for event in events if f"={about}" in event or f" {about} " in event]
        return [f"> {event}" for event in named[-count // 2 :]] + events[-count // 2 :]


def resume_index(shard: SimShard, item: dict[str, Any]) -> int:
    """How many of the shard's records lie before the position a lease row holds."""
    kind = item["position_kind"]["S"]
    if kind == "SHARD_END":
        return len(shard.sequences)
    if kind == "TRIM_HORIZON":
        return 0
    if kind == "AT_TIMESTAMP":
        moment_ms = int(float(item["position_timestamp"]["N"]) * 1000)
        return bisect.bisect_left(shard.arrival_ms, moment_ms)
    sequence = int(item["sequence_number"]["S"])
    if kind == "AT_SEQUENCE_NUMBER" or "sub_sequence_number" in item:
        return bisect.bisect_left(shard.sequences, sequence)  # an aggregate's rest: the record itself is not done
    if kind == "AFTER_SEQUENCE_NUMBER":
        return bisect.bisect_right(shard.sequences, sequence)
    raise AssertionError(f"a checkpoint of kind {kind}")


@dataclass
class _Shard:
    committed: set[int] = field(default_factory=set)  # sequence numbers some sink committed
    verified: int = 0  # records before this index are known committed
    checkpoint: int = 0  # the resume index of the checkpoint in the table
    finished: bool = False  # SHARD_END landed
    unread_since: float | None = None


class Oracle:
    def __init__(
        self,
        seed: int,
        stream: SimStream,
        trace: Trace,
        *,
        failover_s: float,
        reads: Callable[[str, str, int], bool],
    ) -> None:
        self.seed = seed
        self._reads = reads  # (worker, shard, counter): it reads the shard under that claim and trusts it
        self.stream = stream
        self.trace = trace
        self.failover_s = failover_s
        self._shards: dict[str, _Shard] = {}
        self.committed_records = 0
        self.duplicate_records = 0
        self.checkpoints = 0
        #: The end of the last fault that may delay reading (DynamoDB's faults; a late or slow worker's,
        #: which takes its part of a death's leases late): the fleet converges for START_LIMIT_S after it.
        #: A paused worker's own shards are its death's, from the pause (``died``). A doubt is excused by a
        #: fault in that worker's path or the whole table's alone (:meth:`efo.sim.fleet.Fleet.disturbed`).
        self.disturbed_until = 0.0
        #: The end of the last fault of any kind: balance is judged from then on.
        self.any_disturbed_until = 0.0
        self.membership_changed_at = 0.0
        self.unread_max_s = 0.0  # the longest a readable shard went unread, outside faults
        self.takeovers: list[float] = []  # seconds from a death to its last shard read again
        self._deaths: list[tuple[float, set[str], str]] = []  # (when, its shards still unread, who)
        self.doubts = 0
        self._readable: set[str] = set()
        self._members: set[str] = set()
        self.violation: Violation | None = None  # the first one (a worker's task may have swallowed it)

    def _shard(self, shard_id: str) -> _Shard:
        state = self._shards.get(shard_id)
        if state is None:
            state = self._shards[shard_id] = _Shard()
        return state

    def fail(self, now: float, invariant: str, detail: str, about: str | None = None) -> NoReturn:
        """``about``: the shard or worker the violation concerns (its events are shown first)."""
        self.trace.add(now, "oracle", "violation", invariant=invariant)
        if self.violation is None:
            self.violation = Violation(self.seed, now, invariant, detail, self.trace.last(about=about))
        raise self.violation

    # ---- the sinks' side -----------------------------------------------------------------------------

    def committed(self, shard_id: str, sequences: list[str]) -> None:
        state = self._shard(shard_id)
        for sequence in sequences:
            number = int(sequence)
            if number in state.committed:
                self.duplicate_records += 1
            else:
                state.committed.add(number)
                self.committed_records += 1

    def finished(self, shard_id: str) -> bool:
        """SHARD_END landed on the shard's lease (which may have been deleted since)."""
        state = self._shards.get(shard_id)
        return state is not None and state.finished

    def unread_records(self) -> int:
        return sum(len(s.sequences) for s in self.stream.shards.values()) - self.committed_records

    # ---- the table's side: every change of a lease row, as it lands ---------------------------------------

    def row_changed(
        self,
        now: float,
        client: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        request: dict[str, Any],
    ) -> None:
        if after is None or "position_kind" not in after:
            return
        shard_id = after["sk"]["S"].removeprefix("shard|")
        if before is None:
            state = self._shard(shard_id)
            if state.finished:
                detail = f"{client} wrote a new lease of finished {shard_id}"
                self.fail(now, "finished stays finished", detail, shard_id)
            state.finished = after["position_kind"]["S"] == "SHARD_END"  # a closed shard at a LATEST start
            return
        owner, taker = before.get("lease_owner", {}).get("S"), after.get("lease_owner", {}).get("S")
        if owner is not None and taker is not None and owner != taker:
            asked = before.get("wanted_by", {}).get("S") == taker
            counter = int(before.get("lease_counter", {}).get("N", "0"))
            if not asked and self._reads(owner, shard_id, counter):
                self.fail(
                    now,
                    "no false death",
                    f"{taker} took {shard_id} from {owner}, which reads it and trusts it "
                    f"(the write's condition: {request.get('ConditionExpression')})",
                    shard_id,
                )
        shard = self.stream.shards[shard_id]
        old, new = resume_index(shard, before), resume_index(shard, after)
        moved = before.get("position_kind") != after.get("position_kind") or before.get("sequence_number") != after.get(
            "sequence_number"
        )
        if not moved:
            return
        writer = client.split("/")[0]
        reset = "reset_id" in before and "reset_id" not in after
        state = self._shard(shard_id)
        self.checkpoints += 1
        if not reset:
            owner = before.get("lease_owner", {}).get("S")
            if owner != writer:
                self.fail(
                    now, "fenced", f"{writer} moved the checkpoint of {shard_id}, whose lease {owner} holds", shard_id
                )
            if new < old:
                self.fail(
                    now,
                    "monotonic",
                    f"{writer} moved the checkpoint of {shard_id} back from record {old} to {new}",
                    shard_id,
                )
        if after["position_kind"]["S"] == "SHARD_END":
            if not shard.closed:
                self.fail(now, "nothing skipped", f"{writer} wrote SHARD_END on {shard_id}, which is open", shard_id)
            state.finished = True
        state.checkpoint = new
        if new > state.verified:
            missing = [seq for seq in shard.sequences[state.verified : new] if seq not in state.committed]
            if missing:
                self.fail(
                    now,
                    "nothing skipped",
                    f"{writer} checkpointed {shard_id} at record {new}, but {len(missing)} record(s) before it "
                    f"were never committed (the first: {missing[0]})",
                    shard_id,
                )
            state.verified = new

    def subscribing(self, now: float, worker: str, shard_id: str, table_rows: dict[str, dict[str, Any]]) -> None:
        shard = self.stream.shards[shard_id]
        if self._shard(shard_id).finished:
            self.fail(now, "finished stays finished", f"{worker} subscribed to finished {shard_id}", shard_id)
        for parent in shard.parents:
            row = table_rows.get(parent)
            if row is not None and row.get("position_kind", {}).get("S") != "SHARD_END":
                self.fail(
                    now,
                    "parents first",
                    f"{worker} subscribed to {shard_id} before its parent {parent} ended",
                    shard_id,
                )

    # ---- the monitor: every second ---------------------------------------------------------------------

    def died(self, now: float, shards: set[str], who: str) -> None:
        """Worker ``who`` died (or froze) reading ``shards``: each must be read again in time. One
        another worker's earlier death left unread (its first event had not come yet) is this
        death's from now: ``who`` took it over, then died too."""
        for _, unread, earlier in self._deaths:
            if earlier != who:
                unread -= shards
        self._deaths = [death for death in self._deaths if death[1]]
        if shards:
            self._deaths.append((now, set(shards), who))
        for shard_id in shards:
            self._shard(shard_id).unread_since = now
        self.membership_changed_at = now

    def first_event(self, now: float, shard_id: str) -> None:
        """A claim of ``shard_id`` received its first event (a worker reads it now)."""
        for death in list(self._deaths):
            died_at, shards, _ = death
            if shard_id not in shards:
                continue
            shards.discard(shard_id)
            taken_s = now - max(died_at, self.disturbed_until)
            if taken_s > self._allowed_s(died_at):
                self.fail(
                    now, "read again", f"{shard_id} was read again {taken_s:.3f} s after its owner died", shard_id
                )
            if not shards:
                self.takeovers.append(now - died_at)
                self._deaths.remove(death)

    def disturbed(self, until_s: float, *, delays_reading: bool) -> None:
        """A fault lasts until ``until_s``; ``delays_reading``: the fleet's reading converges after it
        (every fault but a pause, whose worker's shards are timed as a death's)."""
        self.any_disturbed_until = max(self.any_disturbed_until, until_s)
        if delays_reading:
            self.disturbed_until = max(self.disturbed_until, until_s)

    def _allowed_s(self, unread_since: float) -> float:
        """How long a shard unread since then may stay so, counted from then or the last fault's end."""
        if unread_since < START_LIMIT_S or unread_since <= self.disturbed_until + START_LIMIT_S:
            return START_LIMIT_S  # the start, or the convergence after a fault
        return self.failover_s + 2.0

    def watch(self, now: float, fleet: Fleet, readable: set[str]) -> None:
        """One look at the fleet: who reads what, who failed, who doubts."""
        readers: dict[str, list[str]] = {}
        counts: dict[str, int] = {}
        for worker in fleet.live():
            if worker.failed is not None:
                self.fail(now, "no exit", f"{worker.name} ended on its own: {worker.failed!r}", worker.name)
            coordinator = worker.coordinator
            assert coordinator is not None
            if coordinator.liveness.trust is Trust.IN_DOUBT:
                if not worker.doubt_seen:
                    worker.doubt_seen = True
                    self.doubts += 1
                    if not fleet.disturbed(worker, now):  # a fault in its path or the table's, lately
                        self.fail(
                            now,
                            "no doubt",
                            f"{worker.name}'s leases went into doubt with no fault injected",
                            worker.name,
                        )
            else:
                worker.doubt_seen = False
            if worker.clock.paused:
                continue
            held = 0
            for shard_id, owned in coordinator.owned.items():
                if owned.phase in READING or (owned.phase is ShardPhase.SUBSCRIBING and owned.first_event):
                    readers.setdefault(shard_id, []).append(worker.name)
                    held += 1
            if coordinator.liveness.trust is Trust.TRUSTED:  # a member: up, and its leases trusted
                counts[worker.name] = held
        for worker in fleet.stopping():  # no longer a member, but it reads on (Coordinator._read_on)
            if worker.clock.paused:
                continue
            for shard_id, owned in worker.coordinator.owned.items():
                if owned.phase in READING:
                    readers.setdefault(shard_id, []).append(worker.name)
        if set(counts) != self._members:  # a worker came up, went into doubt or recovered
            self._members = set(counts)
            self.membership_changed_at = now
        for shard_id in readable:
            state = self._shard(shard_id)
            if shard_id in readers:
                if state.unread_since is not None:
                    unread_s = now - max(state.unread_since, self.disturbed_until)
                    self.unread_max_s = max(self.unread_max_s, unread_s)
                state.unread_since = None
                continue
            if state.unread_since is None:
                state.unread_since = now
            since = max(state.unread_since, self.disturbed_until)
            allowed_s = self._allowed_s(state.unread_since)
            if now - since > allowed_s:
                self.fail(
                    now,
                    "read again",
                    f"{shard_id} has been readable and unread for {now - since:.1f} s (limit {allowed_s:g} s)",
                    shard_id,
                )
        for _died_at, shards, _who in self._deaths:
            shards &= readable  # finished meanwhile: nothing left to take over
        if readable != self._readable:  # a reshard changes the shares as a member does
            self._readable = set(readable)
            self.membership_changed_at = now
        stable_since = max(self.membership_changed_at, self.any_disturbed_until)
        if counts and now - stable_since >= BALANCE_AFTER_S:
            doubled = [shard_id for shard_id, who in readers.items() if len(who) > 1]
            spread = max(counts.values()) - min(counts.values())
            if doubled or spread > 1:
                self.fail(
                    now,
                    "balance",
                    f"{now - stable_since:.0f} s after the last change: {len(doubled)} shard(s) read twice, "
                    f"counts from {min(counts.values())} to {max(counts.values())}",
                )
