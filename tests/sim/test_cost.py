"""The lease plane's steady-state use, as the simulation counts it, is the README's formula."""

from __future__ import annotations

import pytest

from efo.sim.fleet import FleetConfig
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
