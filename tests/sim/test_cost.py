"""The lease plane's steady-state use, as the simulation counts it, is the README's formula."""

from __future__ import annotations

import pytest

from efo.leases import cost
from efo.sim.fleet import FleetConfig, worker_settings
from efo.sim.run import RunConfig
from tests.sim.running import run

#: DynamoDB's limits for one partition key, a second.
KEY_READ_UNITS = 3000
KEY_WRITE_UNITS = 1000


@pytest.mark.parametrize(("shards", "workers", "records_per_shard_s"), [(128, 8, 0.5), (256, 4, 0.5), (128, 8, 0.05)])
def test_a_steady_fleet_costs_what_the_formula_says_within_a_tenth(
    shards: int, workers: int, records_per_shard_s: float, record_property: pytest.RecordProperty
) -> None:
    """Requests by operation, read and write units and their cost, for the fleet and for its busiest
    partition key (at 128 x 8 the control key's heartbeats; at 256 x 4 a lease partition's
    checkpoints) and for its largest lease partition's, and ListShards: each within a tenth of
    efo.leases.cost.steady_state, given the rows' sizes here (the simulation's names are shorter than
    production's: tests/unit/test_cost_rows.py checks those). At a record every 20 s a shard, a fifth
    of the shards have one to checkpoint at each interval, not all of them (the busy shards). The window
    opens after four minutes and lasts sixteen: every worker reads every lease partition at its
    start, then about every 225 s (150 to 300), so a window within the first few of those counts
    what the start set in step, not the rate (from 60 to 240 s, a quarter fewer Queries)."""
    report = run(
        RunConfig(
            fleet=FleetConfig(shards=shards, workers=workers, records_per_shard_s=records_per_shard_s),
            seed=11,
            duration_s=1200.0,
            drain_s=20.0,
            window=(240.0, 1200.0),
        )
    )
    window = report.window
    assert window is not None and window["workers"] == workers
    formula = window["formula"]
    record_property(
        f"cost_{shards}x{workers}_{records_per_shard_s}",
        f"{window['cost_per_s']} read-unit equivalents a second; the formula {formula['cost_per_s']}",
    )
    for measure in (
        "read_units_per_s",
        "write_units_per_s",
        "cost_per_s",
        "list_shards_per_min",
        "checkpoint_write_units_per_s",
        "busiest_key_read_units_per_s",
        "busiest_key_write_units_per_s",
        "busiest_lease_key_read_units_per_s",
    ):
        assert window[measure] == pytest.approx(formula[measure], rel=0.10), (measure, window, formula)
    # The busiest of the lease partitions' checkpoints: the producer's 16 keys a shard fall on the
    # shards unevenly, and at a record every 20 s a shard the checkpoints follow the records one for
    # one, so the busiest partition writes more than the mean partition of its size (+10.5 % here).
    lease_writes = "busiest_lease_key_write_units_per_s"
    spread = 0.10 if records_per_shard_s >= 0.5 else 0.20
    assert window[lease_writes] == pytest.approx(formula[lease_writes], rel=spread), (window, formula)
    requests = window["requests_per_min"]
    assert set(requests) == {*formula["requests_per_min"], "checkpoint"}, requests
    for operation, per_min in formula["requests_per_min"].items():
        assert requests[operation] == pytest.approx(per_min, rel=0.10), (operation, window, formula)
    assert requests["checkpoint"] == pytest.approx(60 * formula["checkpoint_write_units_per_s"], rel=0.10)
    assert window["busiest_key_read_units_per_s"] < KEY_READ_UNITS / 3
    assert window["busiest_key_write_units_per_s"] < KEY_WRITE_UNITS / 3


def test_while_leases_change_no_lease_partition_is_read_more_than_once_strongly_a_worker_a_second(
    record_property: pytest.RecordProperty,
) -> None:
    """A rolling restart moves every worker's leases. Every worker reads again each lease partition
    that changed, at the next cycle: eventually consistent (half the price) unless it made the change,
    and once more when the answer came from before the change (the simulation's eventually consistent
    reads are up to a second old, so about half of them). No second of it asks more of the busiest
    lease partition's key than every live worker reading it strongly once (reading every change
    strongly, as before, asked twice that), and the formula says what that leaves at 16,384 x 256."""
    shards, workers = 1024, 4
    report = run(
        RunConfig(
            fleet=FleetConfig(shards=shards, workers=workers, records_per_shard_s=0.02),
            seed=5,
            duration_s=60.0,
            drain_s=30.0,
            faults=("rolling",),
            window=(10.0, 60.0),
        )
    )
    window = report.window
    assert window is not None
    peak = window["peak_second"]
    settings = worker_settings(FleetConfig(), "arn:sim")
    strong = cost.partition_units(cost.largest_partition(shards), window["row_sizes_b"]["lease"])
    at_scale = cost.during_changes(settings, workers=256, shards=16_384)
    bound = cost.during_changes(settings, workers=256, shards=16_384, behind=cost.BEHIND_AT_MOST)
    record_property(
        "lease_key_peak",
        f"busiest lease key {peak['busiest_lease_key_read_units_per_s']} read units in a second at {shards} x "
        f"{workers} rolling; the formula at 16,384 x 256: {at_scale.read_units_per_s:g} "
        f"(every answer behind once: {bound.read_units_per_s:g})",
    )
    assert 0 < peak["busiest_lease_key_read_units_per_s"] <= (workers + 1) * strong, peak
    assert peak["busiest_lease_key_write_units_per_s"] < KEY_WRITE_UNITS / 3, peak
    assert peak["busiest_key_read_units_per_s"] < KEY_READ_UNITS / 3, peak
    assert at_scale.read_units_per_s < KEY_READ_UNITS / 3
    assert at_scale.write_units_per_s < KEY_WRITE_UNITS / 3
