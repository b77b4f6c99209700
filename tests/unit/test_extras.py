"""Optional dependencies: what only the benchmarks need is in the bench extra, pinned, installed by make install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_async_kinesis_is_a_bench_only_dependency_pinned_and_installed_by_make() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "async-kinesis" in _names(extras["bench"])
    assert "async-kinesis" not in _names(extras["dev"]), "a bench-only dependency is not a dev one"
    assert re.search(r"^async-kinesis==", (ROOT / "constraints.txt").read_text(), re.M), "pinned"
    makefile = (ROOT / "Makefile").read_text()
    installs = re.search(r"pip install .*-e '\.\[([a-z,]+)\]'", makefile)
    assert installs and "bench" in installs.group(1).split(","), (
        "make install (and so .ci/run) installs the bench extra"
    )
