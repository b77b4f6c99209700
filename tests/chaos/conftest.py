"""The chaos run: iterations and seed from the environment, the full-size-only scenarios deselected
unless ``EFO_CHAOS_SIZE=full`` (``make chaos``), and the table of what every scenario measured,
printed at the end (and written to ``EFO_CHAOS_TABLE``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .harness import OUTCOMES, SIZE, TABLE_ENV, markdown_table


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
    return f"chaos: seed {SIZE.seed} (EFO_CHAOS_SEED={SIZE.seed} replays), {SIZE.name} size, {SIZE.iterations} x"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not OUTCOMES:
        return
    terminalreporter.section("chaos")
    terminalreporter.write_line(
        f"seed {SIZE.seed} ({SIZE.name} size, {SIZE.iterations} iteration(s) per scenario): "
        f"EFO_CHAOS_SEED={SIZE.seed} make chaos replays it"
    )
    table = markdown_table(OUTCOMES)
    terminalreporter.write_line(table)
    path = os.environ.get(TABLE_ENV)
    if path:
        Path(path).write_text(report(table))
        terminalreporter.write_line(f"written to {path}")


def report(table: str) -> str:
    return table + "\n"
