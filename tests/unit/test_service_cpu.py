"""bench/service_cpu.py: the baseline it measures beside this tree is the commit before issue 21."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def _baseline() -> str:
    text = (ROOT / "bench" / "service_cpu.py").read_text()
    match = re.search(r'^BASELINE = "([0-9a-f]+)"', text, re.M)
    assert match, "bench/service_cpu.py pins BASELINE"
    return match.group(1)


@pytest.fixture(autouse=True)
def _a_git_tree() -> None:
    if _git("rev-parse", "HEAD").returncode != 0:
        pytest.skip("not in a git checkout")


def test_the_baseline_is_the_commit_before_issue_21_with_everything_else_main_had() -> None:
    """Before issue 21's first change (efo/kinesis/columns.py) and after main's bounded runs
    (efo/worker/bound.py, issue 22): the ratio measures the column path, nothing older or newer."""
    baseline = _baseline()
    assert _git("merge-base", "--is-ancestor", baseline, "HEAD").returncode == 0, "the baseline is in this history"
    assert _git("cat-file", "-e", f"{baseline}:efo/kinesis/columns.py").returncode != 0, "issue 21 not yet in it"
    assert _git("cat-file", "-e", f"{baseline}:efo/worker/bound.py").returncode == 0, "main's bounded runs in it"


def test_the_tree_state_names_the_commit_and_uncommitted_changes() -> None:
    from service_cpu import tree_state

    commit, dirty = tree_state()
    head = _git("rev-parse", "--short", "HEAD").stdout.strip()
    assert commit == head
    assert dirty == bool(_git("status", "--porcelain", "--untracked-files=no").stdout.strip())
