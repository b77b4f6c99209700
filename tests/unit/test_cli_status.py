"""What the operator views compute from one read of the lease table and the shard list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from efo.cli.status import duration, hash_share, lease_record, lease_state, tree_order, worker_statuses
from efo.kinesis.graph import Shard, ShardGraph
from efo.leases.model import Lease, TableState, WorkerRow
from efo.pipeline.records import SHARD_END, Position

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HALF = 2**127
TRIM_HORIZON = Position("TRIM_HORIZON")


def shard(shard_id: str, *parents: str, low: int = 0, high: int = 2**128 - 1) -> Shard:
    return Shard(shard_id, parents, low, high)


def lease(shard_id: str, owner: str | None, checkpoint: Position = TRIM_HORIZON) -> Lease:
    return Lease(shard_id, (), owner, 1, checkpoint)


def test_tree_order_puts_children_after_their_parents_and_a_merge_after_both() -> None:
    # 0 split into 2 and 3; 1 and 2 merged into 4; 5 is a lease of a shard past retention
    graph = ShardGraph.of([shard("s0"), shard("s1"), shard("s2", "s0"), shard("s3", "s0"), shard("s4", "s1", "s2")])
    assert tree_order(graph, ["s0", "s5"]) == [
        ("s0", 0),
        ("s2", 1),
        ("s3", 1),
        ("s1", 0),
        ("s4", 2),  # one deeper than its deepest parent, after the last of them
        ("s5", 0),
    ]


def test_tree_order_treats_a_shard_whose_parents_expired_as_a_root() -> None:
    graph = ShardGraph.of([shard("s7", "gone-1", "gone-2"), shard("s8", "s7")])
    assert tree_order(graph) == [("s7", 0), ("s8", 1)]


def test_worker_statuses_judge_liveness_by_heartbeat_age_and_list_owners_without_a_row() -> None:
    state = TableState(
        workers={
            "fresh": WorkerRow("fresh", 9, NOW - timedelta(seconds=3)),
            "stale": WorkerRow("stale", 4, NOW - timedelta(seconds=10)),
            "unknown": WorkerRow("unknown", 1, None),
        },
        leases={"a": lease("a", "fresh"), "b": lease("b", "ghost")},
    )
    statuses = worker_statuses(state, NOW, failover_s=10)
    assert {w: (s.live, s.heartbeat_age_s) for w, s in statuses.items()} == {
        "fresh": (True, 3.0),
        "stale": (False, 10.0),  # exactly failover_s: dead, as the workers judge it
        "unknown": (False, None),
        "ghost": (False, None),
    }


@pytest.mark.parametrize(
    ("the_lease", "state"),
    [
        (None, "no-lease"),
        (lease("a", "w1"), "reading"),
        (lease("a", "w9"), "owner-dead"),
        (lease("a", None), "free"),
        (lease("a", None, SHARD_END), "finished"),
    ],
)
def test_lease_state(the_lease: Lease | None, state: str) -> None:
    assert lease_state(the_lease, {"w1"}) == state


def test_hash_share_in_percent_of_the_key_space() -> None:
    assert hash_share(0, HALF - 1) == "0.0-50.0%"
    assert hash_share(HALF, 2**128 - 1) == "50.0-100.0%"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.04, "0.0s"), (4.2, "4.2s"), (42, "42s"), (185, "3m05s"), (7800, "2h10m"), (273600, "3d04h")],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_lease_record_of_a_finished_shard_has_no_lag_left() -> None:
    reading = Lease("a", (), "w1", 3, Position("AFTER_SEQUENCE_NUMBER", "42"), NOW, lag_ms=1200)
    assert lease_record(reading, {"w1"}) == {
        "owner": "w1",
        "lease_state": "reading",
        "checkpoint": "AFTER_SEQUENCE_NUMBER:42",
        "checkpointed_at": NOW.isoformat(),
        "lag_ms": 1200,
        "reset_pending": None,
    }
    finished = Lease("a", (), None, 4, SHARD_END, NOW, lag_ms=1200)
    assert lease_record(finished, {"w1"})["lag_ms"] is None
