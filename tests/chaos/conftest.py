"""The chaos run: iterations and seed from the environment, the full-size-only scenarios deselected
unless ``EFO_CHAOS_SIZE=full`` (``make chaos``), and the table of what every scenario measured,
printed at the end (and, with ``EFO_CHAOS_TABLE``, written there as the page docs/chaos.md)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .harness import OUTCOMES, SIZE, TABLE_ENV, Chaos, markdown_table, scenario_notes

ChaosFactory = Callable[..., Chaos]


@pytest.fixture
def chaos(
    request: pytest.FixtureRequest,
    local_stack: StackEndpoints,
    kinesis_client: Any,
    dynamodb_client: Any,
    tmp_path: Path,
    iteration: int,
) -> ChaosFactory:
    """``chaos(scenario, shards=..., **env)``: this iteration of a scenario, on a fresh stream."""

    def make(scenario: str, **options: Any) -> Chaos:
        about = request.function.__doc__ or ""
        return Chaos(
            scenario, iteration, local_stack, kinesis_client, dynamodb_client, tmp_path, about=about, **options
        )

    return make


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "iteration" in metafunc.fixturenames:
        metafunc.parametrize("iteration", range(SIZE.iterations), ids=lambda i: f"i{i}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SIZE.full:
        return
    full_only = [item for item in items if item.get_closest_marker("chaos_full")]
    if full_only:
        config.hook.pytest_deselected(items=full_only)
        items[:] = [item for item in items if not item.get_closest_marker("chaos_full")]


def pytest_report_header(config: pytest.Config) -> str:
    return f"chaos: {replay_line()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not OUTCOMES:
        return
    terminalreporter.section("chaos")
    terminalreporter.write_line(replay_line())
    table = markdown_table(OUTCOMES)
    terminalreporter.write_line(table)
    path = os.environ.get(TABLE_ENV)
    if path:
        Path(path).write_text(report(table))
        terminalreporter.write_line(f"written to {path}")


def replay_line() -> str:
    return (
        f"seed {SIZE.seed}, {SIZE.name} size, {SIZE.iterations} iteration(s) per scenario: "
        f"EFO_CHAOS_SEED={SIZE.seed} make chaos replays it"
    )


def report(table: str) -> str:
    """docs/chaos.md: the table, how it was made, and what each row did."""
    failed = [o for o in OUTCOMES if o.failed]
    lines = [
        "# Chaos run",
        "",
        f"Written by `EFO_CHAOS_SEED={SIZE.seed} make chaos` (tests/chaos; {SIZE.name} size, {SIZE.iterations} "
        f"iteration(s) per scenario) on {time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} shared "
        f"cores, Python {platform.python_version()}, against the local stack (kinesis-local behind the "
        "conformance proxy, moto DynamoDB). The same command replays the same kill points, fault timings "
        "and reshards; the machine's own timing still varies.",
        "",
        table,
        "",
        "- **records**: acknowledged by Kinesis, over all iterations. **lost** and **out-of-order** (per "
        "partition key, in commit order) must be 0.",
        "- **duplicates**: records committed more than once; **allowed**: the records the kills and outages "
        "of the scenario may repeat, each a record a SIGKILLed worker (or any worker, for the DynamoDB "
        "pause) had committed past its shard's checkpoint as the lease table had it at that moment. Every "
        "duplicate must be one of them; where nothing is killed or paused none is allowed.",
        "- **max recovery**: the longest, over the iterations, from the end of a disruption (a kill sent, "
        "the last fault fired, DynamoDB resumed, a reshard ACTIVE, the sink hung) until every record "
        "acknowledged by then, and one written then to every partition key, was committed. Exceptions "
        "are named below.",
        "",
        "## Scenarios",
        "",
        *scenario_notes(OUTCOMES),
    ]
    if failed:
        lines += ["", "## Failed iterations", ""]
        lines += [f"- {o.scenario}, iteration {o.iteration}: {o.failed}" for o in failed]
    return "\n".join(lines) + "\n"
