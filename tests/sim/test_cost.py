"""The lease plane's steady-state use, as the simulation counts it, is the README's formula."""

from __future__ import annotations

import math

import pytest

from efo.leases import cost
from efo.sim.fleet import FleetConfig, worker_settings
from efo.sim.run import RunConfig
from tests.sim.running import run

#: DynamoDB's limits for one partition key, a second.
KEY_READ_UNITS = 3000
KEY_WRITE_UNITS = 1000


def test_a_steady_fleet_costs_what_the_formula_says_within_a_tenth(record_property: pytest.RecordProperty) -> None:
    report = run(
        RunConfig(
            fleet=FleetConfig(shards=128, workers=8, records_per_shard_s=0.5),
            seed=11,
            duration_s=240.0,
            drain_s=20.0,
            window=(60.0, 240.0),
        )
    )
    window = report.window
    assert window is not None and window["workers"] == 8
    formula = window["formula"]
    record_property(
        "cost_128x8", f"{window['cost_per_s']} read-unit equivalents a second; the formula {formula['cost_per_s']}"
    )
    for measure in ("read_units_per_s", "write_units_per_s", "cost_per_s", "list_shards_per_min"):
        assert window[measure] == pytest.approx(formula[measure], rel=0.10), (measure, window, formula)
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
    strong = math.ceil(cost.largest_partition(shards) * cost.LEASE_ROW_B / cost.READ_UNIT_B)
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
