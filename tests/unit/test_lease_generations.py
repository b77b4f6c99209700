"""The lease partitions' generations (efo.leases.model.Layout), against the simulated DynamoDB: a
table grows without moving a lease, writers that know different generations write one lease a
shard, every worker finds every lease, and a release that cannot read a layout refuses it."""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from efo.config import load_settings
from efo.errors import EfoError, LayoutOutdated, LeaseLost
from efo.kinesis.registration import StreamInfo
from efo.leases import admin, cost, model
from efo.leases.codec import GROWN, META_KEY, RESERVED_PREFIX, SHARD_PREFIX
from efo.leases.model import LAYOUT_FORMAT, SHARDS_PER_LEASE_PARTITION, Layout, WorkerRow
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB, client_error
from efo.sim.loop import run
from efo.worker.shardsync import ShardSync
from tests.unit.lease_reads import Cycle

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
START = Position("TRIM_HORIZON")


def _db() -> SimDynamoDB:
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")
    return db


def _table(db: SimDynamoDB, worker: str, clock: SimClock) -> LeaseTable:
    client = db.client(worker, clock, random.Random(2))
    return LeaseTable(client, table="t", app="a", stream_arn="s", worker_id=worker, clock=clock)


def _items(db: SimDynamoDB) -> list[tuple[str, str]]:
    """(pk, sk) of every item in the table now."""
    return [
        (pk, sk)
        for pk, partition in db.tables["t"].partitions.items()
        for sk, row in partition.rows.items()
        if (latest := row.latest()) is not None and latest.item is not None
    ]


def _lease_rows(db: SimDynamoDB) -> Counter[str]:
    """Shard id -> how many lease rows it has, in every partition of the table."""
    return Counter(sk.removeprefix(SHARD_PREFIX) for pk, sk in _items(db) if "#" in pk and sk.startswith(SHARD_PREFIX))


# ---- the layout alone -------------------------------------------------------------------------------


def test_a_generation_numbers_its_partitions_after_every_one_before_it() -> None:
    layout = Layout((8, 16, 40))
    assert layout.partitions == 64 and layout.grown and not Layout((8,)).grown
    for n in range(500):
        shard = f"shardId-{n:012d}"
        assert 0 <= layout.home(shard) == layout.candidate(shard, 0) < 8
        assert 8 <= layout.candidate(shard, 1) < 24
        assert 24 <= layout.newest(shard) == layout.candidate(shard, 2) < 64
    with pytest.raises(ValueError):
        Layout(())
    with pytest.raises(ValueError):
        Layout((8, 0))


def test_a_layout_grows_only_once_its_newest_generation_holds_more_leases_than_its_share() -> None:
    layout = Layout((8,))
    full = 8 * SHARDS_PER_LEASE_PARTITION
    assert layout.grown_for(full, 10 * full) is None
    grown = layout.grown_for(full + 1, 300)
    assert grown is not None and grown.sizes[:1] == (8,)
    # sized for twice the open shards (or the rows, if more): the stream may double before the next
    assert grown.sizes[1] * SHARDS_PER_LEASE_PARTITION >= 2 * (full + 1)
    assert Layout((8,)).grown_for(full + 1, 1000) == Layout((8, 32))
    assert grown.grown_for(0, 10 * full) is None, "nothing written in the new generation yet"


def test_from_4_shards_to_16384_by_splits_no_lease_partition_holds_more_than_twice_its_share() -> None:
    """Every new lease goes to the newest generation, which grows once it holds more than its share:
    a key never holds many more than 64 leases, whatever the first start's size. The worst case for
    the rows: no finished lease is deleted; the lister looks every 256 splits."""
    layout, rows = Layout((8,)), Counter[int]()
    open_shards = [f"shardId-{n:012d}" for n in range(4)]
    for shard_id in open_shards:
        rows[layout.home(shard_id)] += 1
    born = len(open_shards)
    splits = 0
    while len(open_shards) < 16_384:
        parent = open_shards.pop(0)
        for _ in range(2):
            child = f"shardId-{born:012d}"
            born += 1
            open_shards.append(child)
            rows[layout.newest(child)] += 1
        splits += 1
        if splits % 256 == 0:
            newest = sum(count for partition, count in rows.items() if partition >= layout.base(len(layout.sizes) - 1))
            layout = layout.grown_for(newest, len(open_shards)) or layout
        del parent
    assert max(rows.values()) <= 2 * SHARDS_PER_LEASE_PARTITION, (max(rows.values()), layout.sizes)
    assert len(layout.sizes) <= 8, layout.sizes


# ---- the table -------------------------------------------------------------------------------------


def test_a_grown_table_writes_new_leases_in_its_newest_generation_and_reads_old_and_new_ones() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        for n in range(20):
            await table.create_lease(f"old-{n}", (), START, reserve=n % 2 == 0)  # a first start writes none
        layout = await table.lease_layout()
        assert await table.grow(layout, Layout((8, 16)))
        assert not await table.grow(layout, Layout((8, 32))), "grown by another worker already"
        for n in range(20):
            await table.create_lease(f"new-{n}", (), START)
            assert 8 <= table.partition_of(f"new-{n}") < 24
        # a worker started now reads the meta row and finds every lease, and where each is
        other = _table(db, "w2", clock)
        leases = (await other.read()).leases
        assert set(leases) == {f"old-{n}" for n in range(20)} | {f"new-{n}" for n in range(20)}
        assert all(other.partition_of(f"old-{n}") < 8 for n in range(20)), "leases never move"
        # and changes them where they are, even one it never read (a reservation says where)
        third = _table(db, "w3", clock)
        assert (await third.read_lease("new-3")) == leases["new-3"]
        claimed = await other.claim(leases["old-3"])
        await other.checkpoint(claimed, Position("AFTER_SEQUENCE_NUMBER", "9"))
        assert (await third.read_lease("old-3")) is not None
        assert _lease_rows(db) == Counter({shard: 1 for shard in leases})

    run(scenario())


def test_writers_that_know_different_generations_write_one_lease_a_shard_whichever_writes_first() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        stale, grower = _table(db, "stale", clock), _table(db, "grower", clock)
        await grower.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await stale.lease_layout()  # it read the layout before the growth, and not since
        assert await grower.grow(await grower.lease_layout(), Layout((8, 64)))
        moved = [f"s{n}" for n in range(40) if Layout((8, 64)).newest(f"s{n}") != Layout((8,)).home(f"s{n}")]
        assert len(moved) == 40
        for n, shard in enumerate(moved):
            first, second = (stale, grower) if n % 2 else (grower, stale)
            assert await first.create_lease(shard, (), START)
            assert not await second.create_lease(shard, (), START), "a second lease for one shard"
            assert first.partition_of(shard) == second.partition_of(shard)
        assert _lease_rows(db) == Counter(dict.fromkeys(moved, 1))

    run(scenario())


def test_a_lease_written_before_the_table_grew_is_not_written_again_in_the_new_generation() -> None:
    """A first start's leases (and those of a release before reservations) have no reservation: a
    writer of the grown layout looks for the lease in its partition of generation 0 first."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("a", (), START, reserve=False)
        assert await table.grow(await table.lease_layout(), Layout((8, 64)))
        other = _table(db, "w2", clock)
        assert not await other.create_lease("a", (), START)
        assert other.partition_of("a") == Layout((8,)).home("a")
        assert _lease_rows(db) == Counter({"a": 1})
        assert not any(sk.startswith(RESERVED_PREFIX) for _, sk in _items(db))

    run(scenario())


def test_a_worker_reads_the_new_generation_once_a_lease_there_moves_its_version() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        reader, grower = _table(db, "reader", clock), _table(db, "grower", clock)
        await grower.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        assert await reader.layout() == 8
        assert await grower.grow(await grower.lease_layout(), Layout((8, 16)))
        await grower.create_lease("n", (), START)
        versions = (await reader.read_version()).versions
        assert await reader.layout() == 24 and grower.partition_of("n") in versions
        assert set((await reader.read_leases()).leases) == {"n"}

    run(scenario())


def test_a_grown_table_is_removed_whole_every_generation_and_reservation() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("a", (), START)
        assert await table.grow(await table.lease_layout(), Layout((8, 16)))
        await table.create_lease("b", (), START)
        assert await table.grow(await table.lease_layout(), Layout((8, 16, 32)))
        await table.create_lease("c", (), START)
        assert any(sk.startswith(RESERVED_PREFIX) for _, sk in _items(db))
        await admin.delete_all(table)
        assert _items(db) == []

    run(scenario())


def test_a_grown_meta_row_cannot_be_read_as_a_count_of_partitions_by_a_release_before_generations() -> None:
    """A release before generations reads ``lease_partitions`` as a number (``item[...]["N"]``): on a
    grown table it fails there, before it reads or writes a lease, rather than miss every lease of
    the partitions it does not know; its ``reset --delete-all`` deletes them all (``migrating_to``)."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        assert await table.grow(await table.lease_layout(), Layout((8, 16)))
        raw = db.client("operator", clock)
        key = {"pk": {"S": table.partition}, "sk": {"S": META_KEY}}
        item: dict[str, Any] = (await raw.get_item(TableName="t", Key=key, ConsistentRead=True))["Item"]
        assert item["lease_partitions"] == {"S": GROWN}
        with pytest.raises(KeyError):
            int(item["lease_partitions"]["N"])  # what the release before generations does
        assert item["migrating_to"] == {"N": "24"}
        assert item["layout_format"] == {"N": str(LAYOUT_FORMAT)}

    run(scenario())


def test_a_layout_of_a_later_format_is_refused_naming_the_table_the_field_and_what_to_do() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        assert await table.grow(await table.lease_layout(), Layout((8, 16)))
        await db.client("later", clock).update_item(  # what a later release would write
            TableName="t",
            Key={"pk": {"S": table.partition}, "sk": {"S": META_KEY}},
            UpdateExpression="SET layout_format = :later",
            ExpressionAttributeValues={":later": {"N": str(LAYOUT_FORMAT + 1)}},
        )
        with pytest.raises(LayoutOutdated) as refused:
            await _table(db, "w2", clock).read()
        message = str(refused.value)
        assert "'t'" in message and "layout_format" in message and "run the release that wrote it" in message

    run(scenario())


def test_heartbeat_rows_say_this_release_reads_generations() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.heartbeat()
        row = await table.read_worker("w1")
        assert row is not None and row.reads_generations
        assert not WorkerRow("old", 1, None).reads_generations

    run(scenario())


def test_the_lister_grows_the_layout_only_once_no_heartbeat_row_is_of_a_release_before_generations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(model, "SHARDS_PER_LEASE_PARTITION", 4)  # 8 partitions hold 32 leases
    settings = load_settings(stream="s", app="a", sink="console")
    db = _db()
    stream = StreamInfo("s", "s", NOW, "ACTIVE", 2)

    async def scenario() -> None:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        async with table.changing():
            for n in range(33):
                await table.create_lease(f"s{n}", (), START)
        leased = {f"s{n}" for n in range(32)}
        await table.heartbeat()
        raw = db.client("operator", clock)
        await raw.put_item(  # the heartbeat row of a release before generations
            TableName="t",
            Item={"pk": {"S": table.partition}, "sk": {"S": "worker|old"}, "heartbeat": {"N": "1"}},
        )
        sync = ShardSync(settings=settings, stream=stream, kinesis=None, table=table, clock=clock)
        sync.connect(Cycle(leased))
        # another lister (the one before, still listing once more) read the table before the growth
        late_table = _table(db, "w3", clock)
        late = ShardSync(settings=settings, stream=stream, kinesis=None, table=late_table, clock=clock)
        late.connect(Cycle({f"s{n}" for n in range(33)}))
        await late_table.read()
        assert not await sync.grow(40), "not outgrown: 32 leases, 8 partitions of 4"
        leased.add("s32")
        assert not await sync.grow(40), "an older release runs"
        assert await _table(db, "w2", clock).layout() == 8
        await raw.delete_item(  # it stopped
            TableName="t", Key={"pk": {"S": table.partition}, "sk": {"S": "worker|old"}}
        )
        assert await sync.grow(40)
        assert (await _table(db, "w2", clock).lease_layout()).sizes == (8, 20)
        assert not await late.grow(40), "grown by the other lister first"
        assert (await late_table.lease_layout()).sizes == (8, 20), "the other's growth adopted"
        assert not await late.grow(40), "no lease in its newest generation yet"

    run(scenario())


def test_the_safety_net_of_a_grown_table_reads_each_partition_by_its_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formula's arithmetic: 16,384 shards on 256 workers, in a layout of doublings (8 + 32 + 128 +
    512 partitions) with every lease in the last generation, against a table whose first start had
    16,384 (the README's example, leases where they were written, is the test below)."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="a", sink="console")
    layout, shards = Layout((8,)), 64
    while shards < 16_384:
        shards *= 2
        layout = layout.grown_for(shards, shards) or layout
    assert layout.sizes == (8, 32, 128, 512)
    fresh = cost.steady_state(settings, workers=256, shards=16_384)
    spread = cost.spread(16_384)  # the README's "256 partitions of 57 to 70"
    assert (len(spread), sum(spread), min(spread), max(spread)) == (256, 16_384, 57, 70)
    rows = [0] * (layout.partitions - 512) + [32] * 512
    grown = cost.steady_state(settings, workers=256, shards=16_384, partition_rows=rows)
    version = 256 * (math.ceil(layout.partitions * cost.VERSION_ENTRY_B / cost.READ_UNIT_B) - 1)  # 2 units, not 1
    fresh_net = _safety_net(cost.spread(16_384))
    safety_net = grown.read_units_per_s - fresh.read_units_per_s - version + fresh_net
    # An empty partition answers its mark (one unit); 32 leases of 360 B and the mark, 3.
    assert (cost.partition_units(0), cost.partition_units(32)) == (1, 3)
    assert safety_net == pytest.approx(256 / 225 * (168 * 1 + 512 * 3) * 0.5)
    assert round(safety_net) == 969 and round(fresh_net) == 892


def _safety_net(partition_rows: Iterable[int]) -> float:
    """The safety net's read units a second at 256 workers (every partition read eventually
    consistent about every 225 s, at lease.full_read_interval_s's default)."""
    return 256 / 225 * sum(cost.partition_units(rows) for rows in partition_rows) * 0.5


class CountingMeta:
    """A DynamoDB client that counts the GetItems of the meta row."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.meta_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def get_item(self, **request: Any) -> Any:
        self.meta_reads += request["Key"]["sk"]["S"] == META_KEY
        return await self._client.get_item(**request)


def test_a_version_beyond_the_layout_that_the_meta_row_does_not_explain_reads_it_once_not_every_cycle() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = CountingMeta(db.client("w1", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w1", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        assert await table.layout() == 8
        await db.client("other", clock).update_item(  # a version of partition 9, which no meta row names
            TableName="t",
            Key={"pk": {"S": table.partition}, "sk": {"S": "version"}},
            UpdateExpression="ADD p9 :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
        reads = client.meta_reads
        for _ in range(5):
            await table.read_version()
        assert client.meta_reads == reads + 1
        assert await table.layout() == 8

    run(scenario())


def test_a_worker_of_an_older_release_that_started_while_the_layout_grew_is_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its heartbeat row landed between the lister's read of the rows and its growth of the layout."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(model, "SHARDS_PER_LEASE_PARTITION", 4)
    settings = load_settings(stream="s", app="a", sink="console")
    db = _db()

    class Racing(LeaseTable):
        async def grow(self, layout: Layout, grown: Layout) -> bool:
            await db.client("old", SimClock()).put_item(  # the older worker's first heartbeat lands now
                TableName="t", Item={"pk": {"S": self.partition}, "sk": {"S": "worker|old"}, "heartbeat": {"N": "1"}}
            )
            return await super().grow(layout, grown)

    async def scenario() -> None:
        clock = SimClock()
        table = Racing(db.client("w1", clock), table="t", app="a", stream_arn="s", worker_id="w1", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=1)
        async with table.changing():
            for n in range(5):
                await table.create_lease(f"s{n}", (), START)
        sync = ShardSync(settings=settings, stream=StreamInfo("s", "s", NOW, "ACTIVE", 2), kinesis=None, table=table)
        sync.connect(Cycle({f"s{n}" for n in range(5)}))
        with structlog.testing.capture_logs() as logged:
            assert await sync.grow(5)
        errors = [entry for entry in logged if entry["event"] == "lease.layout_grew_under_older"]
        assert [(entry["older_workers"], entry["log_level"]) for entry in errors] == [(["old"], "error")]

    run(scenario())


def test_an_eventually_consistent_answer_from_before_a_lease_was_deleted_does_not_send_its_writes_there() -> None:
    """Review: a first start's lease (no reservation) finished and deleted, the table grown, the shard's
    lease written again (an operator's reset: ``request_reset(recreate=...)``) in the newest generation.
    A worker that then reads its old partition eventually consistent, from a replica a moment behind,
    must still write the lease where it is, not fail on the deleted row at every cycle."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        writer, reader = _table(db, "writer", clock), _table(db, "reader", clock)
        await writer.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await writer.create_lease("s", (), START, reserve=False)
        await clock.sleep(5.0)
        home = Layout((8,)).home("s")
        assert set((await reader.read_leases()).leases) == {"s"} and reader.partition_of("s") == home
        lease = (await writer.read_leases()).leases["s"]
        finished = await writer.finish(await writer.claim(lease))
        assert await writer.delete_finished(finished)
        assert await writer.grow(await writer.lease_layout(), Layout((8, 16)))
        await writer.request_reset(["s"], START, recreate={"s": ()})
        newest = writer.partition_of("s")
        assert newest >= 8 and _lease_rows(db) == Counter({"s": 1})
        await reader.relayout()
        again = (await reader.read_leases()).leases["s"]
        assert reader.partition_of("s") == newest
        # the old partition, eventually consistent: a replica up to a second behind still shows "s" there
        stale = await reader.read_leases({home}, consistent=False)
        assert "s" in stale.leases, "the replica was not behind: the test shows nothing"
        # what the lease cycle does: claim; a failed claim reads the partitions it touched again, strongly
        for _ in range(2):
            try:
                await reader.claim(again)
                break
            except LeaseLost:
                await reader.read_leases(reader.take_changed())
        else:
            raise AssertionError(f"every claim of 's' went to partition {reader.partition_of('s')}, not {newest}")

    run(scenario())


def test_the_readme_safety_net_of_a_grown_table_counts_the_leases_where_they_were_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: leases never move, so the leases of 16,384 shards grown to from 64 by splits are in the
    generations that were newest when each was written, not all in the last one (which is added once
    the one before it is full). The lister looks every 256 splits; finished leases are deleted."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="a", sink="console")
    layout = Layout((8,))
    where = {f"shardId-{n:012d}": layout.home(f"shardId-{n:012d}") for n in range(64)}
    open_shards, born, splits = list(where), 64, 0
    while len(open_shards) < 16_384:
        open_shards.pop(0)
        for child in (f"shardId-{born:012d}", f"shardId-{born + 1:012d}"):
            open_shards.append(child)
            where[child] = layout.newest(child)
        born, splits = born + 2, splits + 1
        if splits % 256 == 0:
            newest = sum(1 for partition in where.values() if partition >= layout.base(len(layout.sizes) - 1))
            layout = layout.grown_for(newest, len(open_shards)) or layout
    rows = Counter(where[shard_id] for shard_id in open_shards)
    fresh = cost.steady_state(settings, workers=256, shards=16_384)
    grown = cost.steady_state(
        settings, workers=256, shards=16_384, partition_rows=[rows[n] for n in range(layout.partitions)]
    )
    version = 256 * (math.ceil(layout.partitions * cost.VERSION_ENTRY_B / cost.READ_UNIT_B) - 1)
    fresh_net = _safety_net(cost.spread(16_384))
    safety_net = round(grown.read_units_per_s - fresh.read_units_per_s - version + fresh_net)
    sizes = " + ".join(map(str, layout.sizes))
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert f"({sizes} partitions" in readme, sizes
    said = f"{safety_net:,} read units a second for the safety net instead of {round(fresh_net):,}"
    assert said in readme, said
    assert f"version row, {layout.partitions} counters, is {version // 256 + 1} read units" in readme, version


class FailingMeta(CountingMeta):
    """A DynamoDB client whose next ``fail`` GetItems of the meta row are throttled (after the SDK's retries)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.fail = 0

    async def get_item(self, **request: Any) -> Any:
        if request["Key"]["sk"]["S"] == META_KEY and self.fail:
            self.fail -= 1
            raise client_error("GetItem", "ProvisionedThroughputExceededException", "throttled")
        return await super().get_item(**request)


def test_a_worker_whose_read_of_the_grown_meta_row_failed_reads_it_again_at_its_next_cycle() -> None:
    """Review: the version names a partition of a generation this worker does not know; its read of the
    meta row is throttled. Its next cycle must read it again, or it never reads the new generation's
    partitions in its full reads (until a lease lands in a partition beyond that one)."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = FailingMeta(db.client("w1", clock, random.Random(2)))
        reader = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w1", clock=clock)
        grower = _table(db, "grower", clock)
        await grower.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        assert await reader.layout() == 8
        assert await grower.grow(await grower.lease_layout(), Layout((8, 16)))
        await grower.create_lease("n", (), START)
        client.fail = 1
        with pytest.raises(EfoError):
            await reader.read_version()
        await reader.read_version()
        assert await reader.layout() == 24

    run(scenario())


def test_the_version_row_of_a_grown_table_is_read_at_its_size_every_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: the version row holds a counter for every lease partition of every generation; the 922
    partitions of a table grown from 64 shards to 16,384 make it more than one read unit, which every
    worker reads strongly at every cycle: the formula counts one."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="a", sink="console")
    layout = Layout((8, 18, 48, 112, 240, 496))
    db = _db()

    async def version_row_b() -> int:
        clock = SimClock()
        table = _table(db, "w1", clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table._bump(range(layout.partitions))
        item = db.tables["t"].partitions[table.partition].rows["version"].latest()
        assert item is not None
        return item.size

    units = -(-run(version_row_b()) // cost.READ_UNIT_B)
    assert units == 2
    fresh = cost.steady_state(settings, workers=256, shards=16_384)
    rows = [0] * (layout.partitions - 256) + list(cost.spread(16_384))
    grown = cost.steady_state(settings, workers=256, shards=16_384, partition_rows=rows)
    safety_net = 256 / 225 * (layout.partitions - 256) * 0.5  # an empty partition: one unit, eventually consistent
    assert grown.read_units_per_s - fresh.read_units_per_s == pytest.approx(
        safety_net + 256 * (units - 1) / settings.lease.sync_interval_s
    )
