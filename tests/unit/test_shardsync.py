"""Shard sync alone, with fakes: who lists the stream, and which leases it writes for new shards."""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from efo.config import Settings, load_settings
from efo.kinesis.registration import StreamInfo
from efo.leases.model import Layout, Lease, TableState
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run
from efo.worker.shardsync import ShardSync
from tests.unit.lease_reads import Cycle

STREAM = StreamInfo("s", "arn:aws:kinesis:us-east-1:1:stream/s", datetime(2026, 1, 1, tzinfo=UTC), "ACTIVE", 2)


class Kinesis:
    def __init__(self, shards: dict[str, tuple[str, ...]]) -> None:
        self.shards = shards
        self.calls = 0

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return {
            "Shards": [
                {
                    "ShardId": shard_id,
                    **({"ParentShardId": parents[0]} if parents else {}),
                    **({"AdjacentParentShardId": parents[1]} if len(parents) > 1 else {}),
                }
                for shard_id, parents in self.shards.items()
            ]
        }


class Table:
    worker_id = "me"

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing
        self.created: list[tuple[str, tuple[str, ...], Position]] = []
        self.unseen: list[str] = []
        self.reads = 0

    async def create_lease(
        self, shard_id: str, parents: tuple[str, ...], start: Position, *, reserve: bool = True
    ) -> bool:
        if shard_id in self.existing:
            return False
        self.existing.add(shard_id)
        self.created.append((shard_id, parents, start))
        return True

    async def unseen_change(self, shard_id: str) -> None:
        self.unseen.append(shard_id)

    def partition_of(self, shard_id: str) -> int:
        return ord(shard_id[0]) % 2

    async def read(self) -> TableState:
        self.reads += 1
        return TableState(leases={s: Lease(s, (), None, 1, Position("TRIM_HORIZON")) for s in self.existing})

    async def lease_layout(self) -> Layout:
        return Layout((8,))  # room for 512 leases: no growth

    def newest_rows(self, shard_ids: set[str]) -> int:
        return len(shard_ids)


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    return load_settings(stream="s", app="a", sink="console")


def _sync(settings: Settings, kinesis: Kinesis, table: Table, leased: set[str], lists: bool) -> ShardSync:
    sync = ShardSync(settings=settings, stream=STREAM, kinesis=kinesis, table=table, clock=SimClock())  # type: ignore[arg-type]
    sync.connect(Cycle(leased, first_live=lists))
    return sync


def test_only_the_worker_that_lists_calls_list_shards(settings: Settings) -> None:
    kinesis, table = Kinesis({"a": (), "b": ()}), Table({"a", "b"})
    others = _sync(settings, kinesis, table, {"a", "b"}, lists=False)
    run(others.sync())
    assert kinesis.calls == 0 and others.graph is None
    lister = _sync(settings, kinesis, table, {"a", "b"}, lists=True)
    run(lister.sync())
    assert kinesis.calls == 1 and lister.graph is not None and set(lister.graph.shards) == {"a", "b"}


def test_the_lister_writes_the_leases_a_listing_shows_missing_and_moves_the_version_of_one_unseen(
    settings: Settings,
) -> None:
    """A child whose lease exists though this worker's read did not show it: its writer died before
    moving its partition's version, so no other worker reads it either. The lister moves it."""
    kinesis = Kinesis({"a": (), "b": (), "c": ("a",), "d": ("a",)})
    table = Table({"a", "b", "d"})  # d was written, its version never moved
    run(_sync(settings, kinesis, table, {"a", "b"}, lists=True).sync())
    assert table.created == [("c", ("a",), Position("TRIM_HORIZON"))]
    assert table.unseen == ["d"]


def test_a_shard_s_children_get_their_leases_from_its_last_event(settings: Settings) -> None:
    kinesis, table = Kinesis({}), Table({"a", "b"})
    sync = _sync(settings, kinesis, table, {"a", "b"}, lists=False)
    run(sync.born({"m": ("a", "b")}))
    assert table.created == [("m", ("a", "b"), Position("TRIM_HORIZON"))] and kinesis.calls == 0


def test_the_lister_never_writes_again_the_lease_of_a_finished_parent_that_was_deleted(settings: Settings) -> None:
    """p split into a and b long ago; p's lease was deleted once both began (efo.leases.cleanup), but
    p is still in the listing (within its retention): reading it again would hand its records on twice."""
    kinesis = Kinesis({"p": (), "a": ("p",), "b": ("p",), "n": ()})
    table = Table({"a", "b"})
    run(_sync(settings, kinesis, table, {"a", "b"}, lists=True).sync())
    assert table.created == [("n", (), Position("TRIM_HORIZON"))]


def test_a_finished_parent_is_not_written_again_when_the_cycle_s_read_missed_its_children(settings: Settings) -> None:
    """Found by the simulation (seed 873 of 64 x 8, every fault): the lister's lease cycle had not
    read a partition again since a version move was lost (throttling), so its last read showed
    neither a finished parent's lease (deleted) nor its children's, and the lister wrote the
    parent's lease again: the shard would be read twice. A closed shard that looks unleased is
    checked against a strong read of the table first."""
    kinesis = Kinesis({"p": (), "a": ("p",), "b": ("p",), "n": ()})
    table = Table({"a", "b"})
    run(_sync(settings, kinesis, table, set(), lists=True).sync())
    assert "p" not in [shard_id for shard_id, _, _ in table.created] and table.reads == 1
    assert [shard_id for shard_id, _, _ in table.created] == ["n"]
    assert sorted(table.unseen) == ["a", "b"], "their partitions' versions move: every worker reads them again"
    table = Table({"a", "b"})
    run(_sync(settings, Kinesis({"a": (), "b": (), "n": ()}), table, {"a", "b"}, lists=True).sync())
    assert table.reads == 0, "an open shard without a lease needs no read of the table"


def test_a_merged_child_whose_other_parent_has_no_lease_yet_is_left_to_the_lister(settings: Settings) -> None:
    """Found by the simulation (seed 126 of 64 x 8, every fault): b was born of a split and merged
    into m before the lister listed it. a's last event wrote m's lease; the lister then took b, a
    shard without a lease that one with a lease descends from, for a deleted parent, and never wrote
    b's: its records were never read. The lister writes such a lineage itself, parents first."""
    kinesis, table = Kinesis({"a": (), "b": ("x",), "x": (), "m": ("a", "b")}), Table({"a", "x"})
    run(_sync(settings, kinesis, table, {"a", "x"}, lists=False).born({"m": ("a", "b")}))
    assert table.created == []
    run(_sync(settings, kinesis, table, {"a", "x"}, lists=True).sync())
    assert table.created == [("b", ("x",), Position("TRIM_HORIZON")), ("m", ("a", "b"), Position("TRIM_HORIZON"))]


def test_a_bootstrap_completed_after_a_reshard_under_latest_reads_the_shard_that_closed_since_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under LATEST a closed shard's lease is written finished: it closed before the first start, so
    it holds nothing to read. But a bootstrap cut short (its worker died, or a throttled write made it
    try again) lists the stream again, after the start: a shard open at the start that closed since
    holds records written after it, which its SHARD_END lease would skip. Only the listing made
    before the start moment tells which shards closed before it."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="a", sink="console", initial_position="LATEST")
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")

    def table(worker: str, clock: SimClock) -> LeaseTable:
        client = db.client(worker, clock, random.Random(2))
        return LeaseTable(client, table="t", app="a", stream_arn=STREAM.arn, worker_id=worker, clock=clock)

    async def scenario() -> None:
        clock = SimClock()
        first = table("w1", clock)  # lists {a}, writes the meta row (the start), dies before any lease
        await first.register_partition()
        await first.create_meta(STREAM.created_at, "LATEST", clock.wall(), lease_partitions=8)
        kinesis = Kinesis({"a": (), "b": ("a",), "c": ("a",)})  # a split after the start
        second = table("w2", clock)
        await ShardSync(settings=settings, stream=STREAM, kinesis=kinesis, table=second, clock=clock).bootstrap()
        leases = (await second.read()).leases
        assert leases["a"].checkpoint.kind == "AT_TIMESTAMP"  # not SHARD_END: its records since the start
        assert leases["b"].checkpoint.kind == leases["c"].checkpoint.kind == "AT_TIMESTAMP"

    run(scenario())


def test_a_bootstrap_another_worker_completed_meanwhile_writes_no_more_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bootstrapping worker that is slow (a throttled table, thousands of shards) or paused is taken
    over: the next completes the bootstrap, runs, and deletes leases that finish (efo.leases.cleanup).
    The first went on writing its listing's leases, and wrote a deleted one again at the start
    position, to be read again after its children. It stops once it finds the bootstrap complete
    (looked at between batches, far shorter than lease.delete_finished_after_s)."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="a", sink="console")
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")

    class Slow(LeaseTable):
        created = 0

        async def create_lease(
            self, shard_id: str, parents: tuple[str, ...], start: Position, *, reserve: bool = True
        ) -> bool:
            Slow.created += 1
            if Slow.created == 40:  # another worker took the bootstrap over and completed it
                await self.complete_meta()
            return await super().create_lease(shard_id, parents, start, reserve=reserve)

    async def scenario() -> None:
        clock = SimClock()
        client = db.client("w1", clock, random.Random(2))
        table = Slow(client, table="t", app="a", stream_arn=STREAM.arn, worker_id="w1", clock=clock)
        kinesis = Kinesis({f"s{n:04}": () for n in range(2000)})
        await ShardSync(settings=settings, stream=STREAM, kinesis=kinesis, table=table, clock=clock).bootstrap()
        assert Slow.created < 1000

    run(scenario())
