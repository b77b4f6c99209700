"""The chaos run: iterations and seed from the environment, the full-size-only scenarios deselected
unless ``EFO_CHAOS_SIZE=full`` (``make chaos``). Each iteration's outcome travels in its test
report, so that the process that prints (one of several under pytest-xdist) gets them all:
tests/conftest.py prints the table at the end (and writes it to ``EFO_CHAOS_TABLE``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .harness import REPORT_PROPERTY, SIZE, Chaos

ChaosFactory = Callable[..., Chaos]


@pytest.fixture
def chaos(
    request: pytest.FixtureRequest,
    local_stack: StackEndpoints,
    kinesis_client: Any,
    dynamodb_client: Any,
    tmp_path: Path,
    iteration: int,
) -> Iterator[ChaosFactory]:
    """``chaos(scenario, shards=..., **env)``: this iteration of a scenario, on a fresh stream."""
    made: list[Chaos] = []

    def make(scenario: str, **options: Any) -> Chaos:
        clients = (kinesis_client, dynamodb_client)
        about, test = request.function.__doc__, request.node.nodeid
        made.append(Chaos(scenario, iteration, local_stack, *clients, tmp_path, about=about, test=test, **options))
        return made[-1]

    yield make
    for run in made:  # in the teardown report only (a property added during the call is in both)
        request.node.user_properties.append((REPORT_PROPERTY, run.outcome.to_json()))


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
