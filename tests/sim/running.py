"""Running a simulation in a test: it fails with the violation and the command that replays it."""

from __future__ import annotations

import pytest

from efo.sim.run import Report, RunConfig, simulate


def replay(config: RunConfig) -> str:
    fleet = config.fleet
    return (
        f"python -m efo.sim run --shards {fleet.shards} --workers {fleet.workers} --seed {config.seed} "
        f"--minutes {config.duration_s / 60:g} --faults {','.join(config.faults) or 'none'} "
        f"--records-per-shard-s {fleet.records_per_shard_s:g} --drain-s {config.drain_s:g}"
    )


def run(config: RunConfig, record_property: pytest.RecordProperty | None = None) -> Report:
    """``config`` simulated; no invariant violated, and every record put committed."""
    report = simulate(config)
    if record_property is not None:
        record_property(
            f"{config.fleet.shards}x{config.fleet.workers}_{'+'.join(config.faults) or 'none'}_seed{config.seed}",
            f"{report.simulated_s:.0f} s in {report.wall_s:.1f} s, "
            f"takeover {max(report.takeovers_s, default=0):.2f} s, duplicates {report.duplicates}",
        )
    assert report.violation is None, f"{report.violation}\nreplay: {replay(config)}"
    assert report.records_committed == report.records_put > 0
    return report
