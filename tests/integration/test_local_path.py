"""The README's "Try it locally" runs as written: its lines, in a shell, in a directory of their own,
end with the records put in Parquet and the stack's state removed.

Two lines are not run here: ``make install`` (the suite runs on what it installed) and ``efo dev
up``, whose stack is the session's (the test writes its state file where ``efo dev`` looks, with no
process of its own for ``efo dev down`` to stop); test_dev_cli.py runs ``efo dev up`` and ``down``
for real. Every other line is the README's, character for character."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from efo.devstack.stack import StackEndpoints, read_state, state_path, write_state

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = {"make install", "efo dev up"}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- local-path:start -->\n```sh\n(.*?)\n```\n<!-- local-path:end -->", text, re.DOTALL)
    assert block, "the README's local path is between <!-- local-path:start --> and <!-- local-path:end -->"
    return [line for line in block.group(1).splitlines() if line.strip()]


def command(line: str) -> str:
    return line.split("  #", 1)[0].strip()


def test_the_readme_local_path_needs_nothing_else_and_names_what_it_skips_here() -> None:
    lines = [command(line) for line in readme_commands()]
    assert set(lines) >= NOT_RUN
    assert lines.index("make install") < lines.index("efo dev up") < lines.index('eval "$(efo dev env)"')
    assert not [line for line in lines if line.startswith("aws ")], "the local path needs no AWS CLI"
    assert lines[-1] == "efo dev down"


def test_the_readme_local_path_runs_as_written(local_stack: StackEndpoints, tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_state(state, local_stack, [])
    work = tmp_path / "clone"
    work.mkdir()
    (work / ".venv").symlink_to(REPO / ".venv")  # the clone's .venv, which make install made
    lines = [line for line in readme_commands() if command(line) not in NOT_RUN]
    env = {name: value for name, value in os.environ.items() if not name.startswith(("EFO_", "AWS_", "VIRTUAL_ENV"))}
    env["EFO_DEV_STATE_DIR"] = str(state)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(REPO / ".venv")))
    result = subprocess.run(
        ["bash", "-c", "set -eo pipefail -x\n" + "\n".join(lines)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert "1000 rows" in result.stdout, result.stdout
    assert "stream 'orders' created with 2 shard(s)" in result.stdout
    assert "put 1,000 records of 200 bytes to stream 'orders' over 8 partition keys" in result.stdout
    assert read_state(state) is None and not state_path(state).exists()  # efo dev down found it
