"""Which finished leases can be deleted (efo.leases.cleanup), and that the worker that lists the stream
never writes again the lease of a shard whose lease was deleted (ShardGraph.needing_leases)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from efo.kinesis.graph import Shard, ShardGraph
from efo.leases.cleanup import deletable
from efo.leases.model import Lease, PendingReset, TableState, WorkerRow
from efo.leases.table import LeaseTable
from efo.pipeline.records import SHARD_END, Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
KEPT_S = 300.0
LONG_AGO = NOW - timedelta(seconds=KEPT_S + 1)
BEGUN = Position("AFTER_SEQUENCE_NUMBER", "7")


def lease(shard_id: str, *parents: str, at: Position = SHARD_END, owner: str | None = None, **kw: object) -> Lease:
    return Lease(shard_id, parents, owner, 3, at, kw.pop("updated_at", LONG_AGO), **kw)  # type: ignore[arg-type]


def state(*leases: Lease) -> TableState:
    return TableState(leases={lease.shard_id: lease for lease in leases})


def listing(**shards: tuple[str, ...]) -> ShardGraph:
    return ShardGraph.of(Shard(shard_id, parents, 0, 0) for shard_id, parents in shards.items())


SPLIT = listing(p=(), a=("p",), b=("p",))


def found(table: TableState, graph: ShardGraph = SPLIT) -> list[str]:
    return [lease.shard_id for lease in deletable(table, graph, NOW, KEPT_S)]


def test_a_split_parent_is_deleted_once_both_children_began() -> None:
    assert found(state(lease("p"), lease("a", "p", at=BEGUN), lease("b", "p", at=BEGUN))) == ["p"]


def test_a_parent_stays_while_a_child_has_no_lease_and_goes_once_it_has_one_begun_or_not() -> None:
    """A missing parent counts as finished, and the lister never writes one again: a child need not
    have begun (an idle child writes no checkpoint, and would keep its parent for ever)."""
    assert found(state(lease("p"), lease("a", "p", at=BEGUN))) == []
    idle = lease("b", "p", at=Position("TRIM_HORIZON"))
    assert found(state(lease("p"), lease("a", "p", at=BEGUN), idle)) == ["p"]


def test_a_lease_finished_lately_owned_reset_or_unfinished_stays() -> None:
    children = (lease("a", "p", at=BEGUN), lease("b", "p", at=BEGUN))
    for parent in (
        lease("p", updated_at=NOW - timedelta(seconds=KEPT_S - 1)),
        lease("p", updated_at=None),
        lease("p", owner="w1"),
        lease("p", reset=PendingReset("r1", Position("TRIM_HORIZON"))),
        lease("p", at=BEGUN),
    ):
        assert found(state(parent, *children)) == [], parent


def test_a_lineage_is_deleted_from_its_oldest_shard_down() -> None:
    chain = listing(g=(), p=("g",), c=("p",))
    table = state(lease("g"), lease("p", "g"), lease("c", "p", at=BEGUN))
    assert found(table, chain) == ["g"]  # p waits until g is gone
    del table.leases["g"]
    assert found(table, chain) == ["p"]


def test_merged_parents_are_deleted_once_the_child_began() -> None:
    merge = listing(a=(), b=(), m=("a", "b"))
    assert found(state(lease("a"), lease("b"), lease("m", "a", "b", at=BEGUN)), merge) == ["a", "b"]


def test_a_closed_shard_listed_without_children_is_not_trusted() -> None:
    assert found(state(lease("p")), listing(p=())) == []


def test_a_shard_gone_from_the_stream_goes_by_the_leases_that_name_it() -> None:
    gone = listing(a=("p",), b=("p",))  # p is past its retention
    assert found(state(lease("p"), lease("a", "p", at=BEGUN), lease("b", "p", at=BEGUN)), gone) == ["p"]
    assert found(state(lease("g"), lease("p", "g"), lease("a", "p")), gone) == ["g"]
    assert found(state(lease("p")), listing()) == ["p"]  # and its children with it


def test_the_lister_writes_leases_for_new_shards_but_never_again_for_a_deleted_lineage() -> None:
    graph = listing(g=(), p=("g",), a=("p",), b=("p",), n=())
    assert graph.needing_leases({"a", "b"}) == ["n"]  # g and p were deleted; n is new
    assert graph.needing_leases({"p", "a"}) == ["b", "n"]  # b was born and has no lease yet
    assert graph.needing_leases(set()) == ["g", "n", "p", "a", "b"]  # parents first: a child's lease hides them


def test_a_lineage_s_missing_leases_are_written_parents_first_whatever_their_names() -> None:
    graph = listing(z=(), y=("z",), x=("y",), w=(), v=("w", "x"))
    order = graph.needing_leases(set())
    assert all(order.index(p) < order.index(s) for s in order for p in graph.shards[s].parents), order


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["split", "merge"])), max_size=12))
def test_deleting_what_is_deletable_never_makes_the_lister_write_a_lease_again(steps: list[tuple[int, str]]) -> None:
    """Reshard at random, finish the parents, delete whatever is deletable, again and again: the
    listing never shows a shard that needs a lease and has none, and no lease's parent is unfinished."""
    shards: dict[str, tuple[str, ...]] = {"s0": ()}
    leases = {"s0": lease("s0", at=BEGUN)}
    opened = ["s0"]
    for pick, kind in steps:
        if kind == "merge" and len(opened) >= 2:
            i = pick % (len(opened) - 1)
            parents = (opened[i], opened[i + 1])
            child = f"s{len(shards)}"
            shards[child] = parents
            opened[i : i + 2] = [child]
            born = [child]
        else:
            i = pick % len(opened)
            parent = opened[i]
            born = [f"s{len(shards)}", f"s{len(shards) + 1}"]
            for child in born:
                shards[child] = (parent,)
            opened[i : i + 1] = born
            parents = (parent,)
        for parent in parents:
            leases[parent] = lease(parent, *shards[parent])  # finished
        for child in born:
            leases[child] = lease(child, *shards[child], at=BEGUN)
        graph = listing(**shards)
        for gone in deletable(TableState(leases=dict(leases)), graph, NOW, KEPT_S):
            del leases[gone.shard_id]
        assert graph.needing_leases(set(leases)) == []
        for lease_ in leases.values():
            assert all(p not in leases or leases[p].finished for p in lease_.parents)


def test_a_reset_of_every_shard_racing_the_delete_of_a_finished_lease_still_resets_every_shard() -> None:
    """``efo checkpoints reset --all`` reads the leases, asks the operator, then writes the resets;
    the lister may delete a finished lease in between (the delete's condition keeps a lease whose
    reset landed first, not the other way round). The reset then failed half-way, on the deleted
    row: the shards before it restarted, those after it (its children) did not. A row deleted since
    the read is written again at the position (from the listing), and the reset goes on."""
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")

    async def scenario() -> None:
        clock = SimClock()
        client = db.client("op", clock, random.Random(2))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="op", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.complete_meta()
        await table.create_lease("s0", (), SHARD_END)
        await table.create_lease("s1", ("s0",), BEGUN)
        await table.create_lease("s2", ("s0",), BEGUN)
        read = await table.read()  # the operator's read, then the lister deletes s0
        assert await table.delete_finished(read.leases["s0"])
        graph = listing(s0=(), s1=("s0",), s2=("s0",))
        parents = {shard_id: shard.parents for shard_id, shard in graph.shards.items()}
        reset_id = await table.request_reset(sorted(read.leases), Position("TRIM_HORIZON"), recreate=parents)
        after = (await table.read()).leases
        assert sorted(after) == ["s0", "s1", "s2"]
        assert all(lease.reset is not None and lease.reset.reset_id == reset_id for lease in after.values())
        assert after["s0"].parents == () and after["s1"].parents == ("s0",)

    run(scenario())


def test_nothing_is_deleted_while_a_worker_of_a_release_that_writes_deleted_leases_again_runs() -> None:
    """A release before deletion wrote a lease at TRIM_HORIZON for every listed shard without one, on
    every worker, every listing. In a rolling deploy its workers would write a deleted parent's lease
    again, and its records would be read a second time after its children's. A worker's heartbeat row
    says whether its release deletes (and so never writes a deleted lease again): nothing is deleted
    while a row without it is seen."""
    finished = state(lease("p"), lease("a", "p", at=BEGUN), lease("b", "p", at=BEGUN))
    finished.workers = {"w1": WorkerRow("w1", 1, None, deletes_leases=True)}
    assert found(finished) == ["p"]
    finished.workers["old"] = WorkerRow("old", 1, None)  # a row of the release before
    assert found(finished) == []


def test_a_reset_of_every_shard_writes_deleted_leases_parents_first_whatever_their_names() -> None:
    """efo checkpoints reset --all writes a lease for every listed shard without one before the
    resets; a child's written first (the command dying in between) would hide its parent for ever."""
    graph = listing(z=(), a=("z",), m=("a", "y"), y=())
    order = graph.parents_first({"z", "a", "m", "y"})
    assert order.index("z") < order.index("a") < order.index("m") and order.index("y") < order.index("m")
