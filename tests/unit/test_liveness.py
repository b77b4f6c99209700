"""Liveness alone, in virtual time (the shared fake clock): when a worker trusts its leases."""

from __future__ import annotations

import asyncio

import pytest

from efo.config import LeaseSettings
from efo.errors import Retriable
from efo.sim.clock import SimClock
from efo.sim.loop import run
from efo.worker.liveness import Liveness, Trust


class Writer:
    worker_id = "me"

    def __init__(self) -> None:
        self.failing = False
        self.beats = 0
        self.latency_s = 0.0
        self.written: list[tuple[float, bool]] = []  # (when it landed, in_doubt)
        self.leaving: list[bool] = []  # what each that landed said of it

    async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
        """The row is written halfway through the latency, the answer comes after the rest (so a
        write abandoned after its timeout may still have landed, as on the wire)."""
        await asyncio.sleep(self.latency_s / 2)
        if self.failing:
            raise Retriable("ProvisionedThroughputExceededException")
        self.beats += 1
        self.written.append((asyncio.get_running_loop().time(), in_doubt))
        self.leaving.append(leaving)
        await asyncio.sleep(self.latency_s / 2)
        return True


async def _run_for(liveness: Liveness, seconds: float) -> None:
    """The heartbeat loop for ``seconds`` of virtual time, then stopped (as a worker's end does)."""
    task = asyncio.ensure_future(liveness.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    liveness.close()


@pytest.fixture
def parts() -> tuple[Liveness, Writer, list[str]]:
    writer, events = Writer(), []
    liveness = Liveness(
        writer,
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=10.0),
        on_expired=lambda: events.append("expired"),
        on_recovered=lambda: events.append("recovered"),
        clock=SimClock(),
    )
    return liveness, writer, events


def test_no_lease_is_trusted_before_the_first_heartbeat_lands_and_landing_is_no_recovery(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        writer.failing = True
        assert not await liveness.beat()
        assert liveness.trust is Trust.UNPROVEN and liveness.in_doubt and not liveness.valid
        writer.failing = False
        assert await liveness.beat()
        assert liveness.trust is Trust.TRUSTED and not liveness.in_doubt and liveness.valid
        assert events == []
        liveness.close()

    run(scenario())


def test_a_worker_leaving_says_so_at_once_and_in_every_heartbeat_after(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        task = asyncio.create_task(liveness.run())
        await asyncio.sleep(3.0)
        assert writer.leaving and not any(writer.leaving)
        before = len(writer.leaving)
        assert await liveness.leave()
        assert writer.leaving[before:] == [True]  # at once, not at the next interval
        await asyncio.sleep(4.0)
        assert len(writer.leaving) > before + 1 and all(writer.leaving[before:])
        assert liveness.trust is Trust.TRUSTED and events == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        liveness.close()

    run(scenario())


def test_trust_lasts_failover_minus_one_interval_after_the_last_landing_then_recovers_in_two_beats(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        await liveness.beat()
        writer.failing = True
        await asyncio.sleep(7.9)
        assert liveness.valid and events == []
        await asyncio.sleep(0.2)  # past 8 s = failover 10 s - heartbeat 2 s
        assert liveness.trust is Trust.IN_DOUBT and not liveness.valid and events == ["expired"]
        writer.failing = False
        await liveness.beat()  # written in doubt: the row says so until the next one lands
        assert liveness.trust is Trust.RECOVERING and liveness.in_doubt and events == ["expired"]
        await liveness.beat()
        assert liveness.trust is Trust.TRUSTED and events == ["expired", "recovered"]
        liveness.close()

    run(scenario())


def test_each_landing_moves_the_deadline(parts: tuple[Liveness, Writer, list[str]]) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        for _ in range(10):
            await liveness.beat()
            await asyncio.sleep(2.0)
        assert liveness.trust is Trust.TRUSTED and events == [] and writer.beats == 10
        liveness.close()

    run(scenario())


def test_a_heartbeat_that_lands_late_counts_from_when_it_was_sent(parts: tuple[Liveness, Writer, list[str]]) -> None:
    """Trust runs from the send, not the answer: a write answered 3 s late leaves 5 s of trust."""
    liveness, writer, events = parts

    async def late(*, in_doubt: bool = False, leaving: bool = False) -> bool:
        await asyncio.sleep(3.0)
        writer.beats += 1
        return True

    async def scenario() -> None:
        writer.heartbeat = late  # type: ignore[method-assign]
        await liveness.beat()
        assert liveness.landed_at == 0.0
        await asyncio.sleep(4.9)  # 7.9 s after the send
        assert liveness.valid and events == []
        await asyncio.sleep(0.2)
        assert liveness.trust is Trust.IN_DOUBT and events == ["expired"]
        liveness.close()

    run(scenario())


def test_heartbeats_go_out_on_schedule_so_a_slow_dynamodb_below_the_validity_keeps_trust(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    """Each write answered 5 s late (validity 8 s): waiting for each answer before the next interval
    left 7 s between sends and a gap in trust; on a fixed schedule, trust never lapses."""
    liveness, writer, events = parts

    async def scenario() -> None:
        await liveness.beat()
        writer.latency_s = 5.0
        await _run_for(liveness, 60.0)

    run(scenario())
    assert events == [], "the leases went into doubt"
    assert writer.beats >= 28  # one every 2 s, each answered 5 s later


def test_a_worker_whose_trust_lapses_between_two_heartbeats_says_so_at_once() -> None:
    """Found by the simulation (seeds 3 and 24 of 64 x 8, every fault, a worker's loop 3.7-3.9 s late):
    each heartbeat's answer was read just after the validity of the one before ran out, so the worker
    was in doubt for a moment before each landing and dropped its leases every time, but no
    heartbeat went out in those moments: every row it wrote said it was well, its counter kept
    moving, and nobody took the shards it no longer read (13 s and more). Here: trust lasts 7 s,
    every answer comes 5.5 s after its send, every 2 s; each lapse lasts 0.5 s between two sends."""
    writer, events = Writer(), []
    liveness = Liveness(
        writer,
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=9.0),
        on_expired=lambda: events.append("expired"),
        on_recovered=lambda: events.append("recovered"),
        clock=SimClock(),
    )

    async def scenario() -> None:
        assert await liveness.beat()  # at 0: trusted until 7
        writer.latency_s = 5.5
        await _run_for(liveness, 20.0)

    run(scenario())
    assert events[0] == "expired", events
    assert [in_doubt for _, in_doubt in writer.written].count(True) >= 1, "the row never said in doubt"


def test_a_heartbeat_asked_for_at_once_while_the_most_are_under_way_goes_out_when_one_ends() -> None:
    """Found in review: the heartbeat asked for at the start of a doubt was dropped when as many as
    fit in the validity were under way (DynamoDB throttling every one, each error back after 7.9 s),
    and the schedule moved on a slot as if it had gone out: the first written in doubt went out at
    12 s, later than the schedule's own at 10 s. It now waits for the first under way to end."""
    sent: list[tuple[float, bool]] = []
    throttled = False

    class Throttled:
        worker_id = "me"

        async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
            sent.append((asyncio.get_running_loop().time(), in_doubt))
            if throttled:
                await asyncio.sleep(7.9)
                raise Retriable("ProvisionedThroughputExceededException")
            return True

    liveness = Liveness(
        Throttled(),
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=10.0),  # valid 8 s; at most 4 under way
        on_expired=lambda: None,
        on_recovered=lambda: None,
        clock=SimClock(),
    )

    async def scenario() -> None:
        nonlocal throttled
        assert await liveness.beat()
        task = asyncio.ensure_future(liveness.run())  # at 2, 4, 6, 8, ...
        await asyncio.sleep(1.5)
        assert await liveness.beat()  # off the schedule (as a recovery's): valid until 9.5
        throttled = True
        await asyncio.sleep(14.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        liveness.close()

    run(scenario())
    in_doubt = [round(at, 3) for at, doubt in sent if doubt]
    assert in_doubt[0] == 9.9, sent  # the one sent at 2 s ended: in doubt since 9.5
    assert in_doubt[1:] == [12.0, 14.0], "then the schedule's, on its slots (the one due at 10 had no room)"


def test_a_heartbeat_written_in_doubt_says_so(parts: tuple[Liveness, Writer, list[str]]) -> None:
    """Race d of issue 37: a worker whose heartbeats land after its validity stayed in doubt (reading
    nothing) while the others saw its counter move and left its leases alone. Written in doubt, the
    row says so, and the others take its leases at once (efo.leases.view)."""
    liveness, writer, events = parts

    async def scenario() -> None:
        await liveness.beat()
        writer.latency_s = 9.0  # past the validity of 8 s: each one lands, too late to count
        await _run_for(liveness, 40.0)

    run(scenario())
    assert events == ["expired"]
    assert any(in_doubt for _, in_doubt in writer.written), writer.written


class Row:
    """The heartbeat row as DynamoDB keeps it: a write lands only with a counter above the row's
    (the condition of LeaseTable.heartbeat), each write after its own latency."""

    worker_id = "me"

    def __init__(self) -> None:
        self.counter = 0
        self.beat = 0
        self.in_doubt = False
        self.latencies_s: list[float] = []

    async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
        self.counter += 1
        counter = self.counter
        await asyncio.sleep(self.latencies_s.pop(0) if self.latencies_s else 0.0)
        if counter <= self.beat:
            return False
        self.beat, self.in_doubt = counter, in_doubt
        return True


def test_a_heartbeat_sent_before_the_doubt_that_lands_after_it_does_not_make_the_worker_trusted() -> None:
    """Found by the simulation (seed 104 of 64 x 8, every fault): a heartbeat sent just before the
    worker went into doubt landed after the one written in doubt was sent. The worker trusted itself
    again, and then the one written in doubt landed: the row said "in doubt" while the worker claimed
    and read leases, which the others took from it at once."""
    row = Row()
    liveness = Liveness(
        row,
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=10.0),
        on_expired=lambda: None,
        on_recovered=lambda: None,
        clock=SimClock(),
    )

    async def scenario() -> None:
        assert await liveness.beat()  # at 0: trusted until 8
        await asyncio.sleep(7.9)
        row.latencies_s = [2.2, 1.5]
        before = asyncio.ensure_future(liveness.beat())  # sent trusted at 7.9, lands at 10.1
        await asyncio.sleep(1.1)
        assert liveness.trust is Trust.IN_DOUBT
        written_in_doubt = asyncio.ensure_future(liveness.beat())  # sent at 9.0, lands at 10.5
        await asyncio.sleep(1.2)  # 10.2: the one sent before the doubt landed
        assert await before
        assert liveness.trust is not Trust.TRUSTED, "a heartbeat written in doubt may still land"
        await asyncio.sleep(0.4)  # 10.6: it did
        assert await written_in_doubt and row.in_doubt
        assert liveness.trust is Trust.RECOVERING
        assert await liveness.beat()
        assert liveness.trust is Trust.TRUSTED and not row.in_doubt
        liveness.close()

    run(scenario())
