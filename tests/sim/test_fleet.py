"""The lease plane in simulated time: every fault at once, takeover, and replays.

Each run is the real code of every worker (efo.coordinator and everything under it) against the
simulated DynamoDB and Kinesis of efo.sim, on one virtual clock, with the invariants of
efo.sim.invariants checked as it goes. A failing run prints the command that replays it
(``make test`` runs with PYTHONHASHSEED=0, as ``python -m efo.sim`` does, so it replays exactly).
"""

from __future__ import annotations

import pytest

from efo.sim import faults
from efo.sim.fleet import FleetConfig
from efo.sim.run import RunConfig, simulate
from tests.sim.running import run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_fault_at_once_keeps_every_invariant(seed: int, record_property: pytest.RecordProperty) -> None:
    run(
        RunConfig(fleet=FleetConfig(shards=256, workers=16), seed=seed, duration_s=180.0, faults=faults.FAULTS),
        record_property,
    )


def test_a_killed_worker_s_shards_are_read_again_within_failover_plus_two_seconds() -> None:
    report = run(RunConfig(fleet=FleetConfig(shards=64, workers=8), seed=3, duration_s=60.0, faults=("kill",)))
    assert len(report.takeovers_s) == 1 and report.takeovers_s[0] <= 12.0, report.takeovers_s


def test_a_seed_replays_the_same_run() -> None:
    config = RunConfig(fleet=FleetConfig(shards=16, workers=4), seed=7, duration_s=60.0, faults=("kill", "throttle-op"))
    first, second = simulate(config).to_json(), simulate(config).to_json()
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second


def test_the_environment_changes_no_simulated_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run is a function of its config and seed: the EFO_* variables of whoever runs it (an
    operator's own settings, make chaos's EFO_LONG_TESTS) neither change nor refuse it."""
    config = RunConfig(fleet=FleetConfig(shards=16, workers=4), seed=7, duration_s=30.0, faults=("kill",))
    plain = simulate(config).to_json()
    monkeypatch.setenv("EFO_LEASE__FAILOVER_S", "30")
    monkeypatch.setenv("EFO_LONG_TESTS", "1")
    changed = simulate(config).to_json()
    plain.pop("wall_s"), changed.pop("wall_s")
    assert changed == plain
