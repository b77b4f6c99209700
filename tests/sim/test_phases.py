"""The bench's fleet phases in simulated time (efo.sim.phases): a small fleet through a mass start,
busy and idle windows, a join, a takeover and a rolling deploy meets the goals make bench checks at
scale, and the measures themselves see what they are meant to."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Any

import pytest

from efo.leases.lifecycle import ShardPhase
from efo.sim.fleet import FleetConfig
from efo.sim.phases import PHASES, PhasesConfig, PhasesReport, Unread, _kind, finished, run_phases

FAILOVER_S = 10.0


@pytest.fixture(scope="module")
def report() -> PhasesReport:
    return run_phases(
        PhasesConfig(fleet=FleetConfig(shards=64, workers=4, records_per_shard_s=1.0), seed=3, settle_s=5, window_s=20)
    )


def test_every_phase_runs_and_no_invariant_is_violated(report: PhasesReport) -> None:
    assert report.violation is None, report.violation
    assert list(report.phases) == list(PHASES)
    assert [report.phases[name]["in_doubt"] for name in PHASES] == [0] * len(PHASES)
    assert report.simulated_s == report.phases["rolling"]["to_s"]


def test_a_mass_start_and_a_join_balance_within_thirty_seconds(report: PhasesReport) -> None:
    start, join = report.phases["start"], report.phases["join"]
    assert start["claims"] == 64, start
    assert start["balanced_s"] is not None and start["balanced_s"] <= 30, start
    assert start["ready_s"] is not None and start["ready_s"] <= 30, start
    assert start["seen"] == {"read": 64, "unread": 0, "doubled": 0, "spread": 0, "moving": False}
    assert join["balanced_s"] is not None and join["balanced_s"] <= 30, join
    assert join["handovers"] > 0, "a fifth worker gets its share by handovers"
    assert join["seen"]["spread"] <= 1 and join["seen"]["read"] == 64


def test_a_killed_worker_s_shards_are_read_again_within_failover_plus_two_seconds(report: PhasesReport) -> None:
    takeover = report.phases["takeover"]
    assert takeover["shards"] > 0 and takeover["claims"] >= takeover["shards"], takeover
    assert takeover["takeover_s"] is not None, takeover
    # Not before the failover: a dead worker's heartbeat must stop moving for failover_s first.
    assert FAILOVER_S / 2 < takeover["takeover_s"] <= FAILOVER_S + 2, takeover


def test_a_rolling_deploy_replaces_every_worker_and_leaves_no_shard_unread_five_seconds(report: PhasesReport) -> None:
    rolling = report.phases["rolling"]
    assert rolling["replaced"] == rolling["of"] == 4, rolling
    assert rolling["not_ready"] == 0 and rolling["balanced_s"] is not None, rolling
    assert 0 < rolling["longest_unread_s"] <= 5, rolling  # a handover leaves a shard unread a moment
    assert rolling["claims"] >= 64, "every shard moved to a new worker"


def test_steady_windows_count_what_the_fleet_asks(report: PhasesReport) -> None:
    busy, idle = report.phases["busy"], report.phases["idle"]
    heartbeats_per_min = 4 * 60 / 2.0  # four workers, one every heartbeat_interval_s
    for window in (busy, idle):
        assert window["workers"] == 4 and window["seconds"] == 20
        assert window["heartbeats_per_min"] == pytest.approx(heartbeats_per_min, abs=6), window
        assert window["cost_per_s"] == pytest.approx(window["formula"]["cost_per_s"], rel=0.15), window
    assert busy["checkpoint_write_units_per_s"] == pytest.approx(64 / 5, rel=0.15), busy
    assert busy["writes_per_min"]["checkpoint"] == busy["requests_per_min"]["checkpoint"]
    assert idle["other_writes_per_min"] == 0 and idle["checkpoint_write_units_per_s"] == 0, idle


def test_a_seed_replays_the_same_phases() -> None:
    config = PhasesConfig(fleet=FleetConfig(shards=16, workers=2), seed=5, settle_s=2, window_s=5, roll=1)
    first, second = run_phases(config).to_json(), run_phases(config).to_json()
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second


def test_progress_is_reported_after_each_phase_and_each_worker_a_rolling_deploy_replaces() -> None:
    """A run stopped by a budget during a long rolling deploy (256 workers take hours of CPU here)
    still reports the workers replaced and the longest unread until then, marked ``partial``."""
    seen: list[tuple[list[str], dict[str, Any] | None]] = []
    run_phases(
        PhasesConfig(fleet=FleetConfig(shards=16, workers=3), seed=2, settle_s=1, window_s=3),
        progress=lambda report: seen.append((finished(report.phases), copy.deepcopy(report.phases.get("rolling")))),
    )
    phases_done = [done for i, (done, _) in enumerate(seen) if i == 0 or done != seen[i - 1][0]]
    assert phases_done == [list(PHASES[: i + 1]) for i in range(len(PHASES))]
    partial = [roll for done, roll in seen if roll is not None and roll.get("partial")]
    assert [roll["replaced"] for roll in partial] == [0, 1, 2], partial  # as each old worker's stop begins
    assert all(roll["of"] == 3 and "longest_unread_s" in roll and "in_doubt" in roll for roll in partial)
    final = seen[-1][1]
    assert final is not None and "partial" not in final and final["replaced"] == 3


def test_an_impossible_size_or_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        run_phases(PhasesConfig(fleet=FleetConfig(shards=8, workers=0)))
    with pytest.raises(ValueError, match="window_s"):
        run_phases(PhasesConfig(fleet=FleetConfig(shards=8, workers=2), window_s=0))
    with pytest.raises(ValueError, match="roll"):
        run_phases(PhasesConfig(fleet=FleetConfig(shards=8, workers=2), roll=-1))
    with pytest.raises(ValueError, match="min_ready_s = -1: a finite number at least 0"):
        run_phases(PhasesConfig(fleet=FleetConfig(shards=8, workers=2), min_ready_s=-1))
    for bad in ({"window_s": math.nan}, {"timeout_s": math.nan}, {"settle_s": math.inf}):  # ran, nan in every figure
        with pytest.raises(ValueError, match="a finite number"):
            run_phases(PhasesConfig(fleet=FleetConfig(shards=8, workers=2), **bad))


def test_writes_are_told_apart_as_the_meter_tells_them() -> None:
    assert _kind("PutItem", {"Item": {"pk": {}, "sk": {}, "heartbeat": {"N": "3"}}}) == "heartbeat"
    assert _kind("PutItem", {"Item": {"pk": {}, "sk": {}, "lease_counter": {"N": "0"}}}) == "PutItem"
    checkpoint = "SET position_kind = :kind, sequence_number = :seq"
    assert _kind("UpdateItem", {"UpdateExpression": checkpoint}) == "checkpoint"
    claim = "SET lease_owner = :me, lease_counter = :next, position_kind = :kind"
    assert _kind("UpdateItem", {"UpdateExpression": claim}) == "UpdateItem"


class _World:
    """What Unread looks at: a clock, workers with their owned shards, the readable shards."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.clock = SimpleNamespace(now=lambda: self.now_s)
        self.workers: list[Any] = []
        self.shards = {"s1", "s2"}

    def worker(self, *shards: str, first_event: bool = True, phase: ShardPhase = ShardPhase.READING) -> Any:
        owned = {s: SimpleNamespace(phase=phase, first_event=first_event) for s in shards}
        worker = SimpleNamespace(
            name=f"w{len(self.workers) + 1}",
            task=object(),
            killed=False,
            stopped=False,
            coordinator=SimpleNamespace(owned=owned),
        )
        self.workers.append(worker)
        return worker

    def readable(self) -> set[str]:
        return set(self.shards)


def test_unread_counts_a_shard_from_when_no_worker_reads_it_until_one_does() -> None:
    world = _World()
    first = world.worker("s1", "s2")
    unread = Unread(world)  # type: ignore[arg-type]
    unread.sample()
    assert unread.longest_until_now() == 0
    world.now_s = 1.0
    first.coordinator.owned["s2"].phase = ShardPhase.RELEASING  # handed over: no longer read
    unread.sample()
    world.now_s = 3.5
    second = world.worker("s2", first_event=False)  # claimed, subscribing: not read yet
    unread.sample()
    assert unread.longest_until_now() == 2.5
    world.now_s = 4.0
    second.coordinator.owned["s2"].first_event = True
    unread.sample()
    world.now_s = 10.0
    unread.sample()
    assert unread.longest_until_now() == 3.0, "from the handover (1.0) to the new owner's first event (4.0)"
    first.killed = True  # a killed worker's shards are unread, whatever its state says
    unread.sample()
    world.now_s = 12.0
    assert unread.longest_until_now() == 3.0
    unread.sample()
    assert unread.longest_until_now() == 3.0, "s1 unread 2 s so far"
    world.now_s = 14.0
    assert unread.longest_until_now() == 4.0
    unread.restart()
    assert unread.longest_until_now() == 0.0, "a phase counts from its start"


def test_unread_names_its_longest_stretch_the_shard_and_the_workers_before_and_after() -> None:
    world = _World()
    first = world.worker("s1", "s2")
    unread = Unread(world)  # type: ignore[arg-type]
    unread.sample()
    assert unread.named() is None
    world.now_s = 1.0
    first.coordinator.owned["s2"].phase = ShardPhase.RELEASING
    unread.sample()
    world.now_s = 2.0
    assert unread.named() == {"shard": "s2", "from_s": 1.0, "to_s": None, "before": "w1", "after": None}, "unread"
    world.worker("s2")
    unread.sample()
    assert unread.named() == {"shard": "s2", "from_s": 1.0, "to_s": 2.0, "before": "w1", "after": "w2"}
    world.now_s = 3.0
    first.coordinator.owned["s1"].phase = ShardPhase.RELEASING
    unread.sample()
    world.now_s = 3.5
    world.worker("s1")
    unread.sample()
    longest = unread.named()
    assert longest is not None and longest["shard"] == "s2", "0.5 s is not the longest"
    unread.restart()
    assert unread.named() is None
