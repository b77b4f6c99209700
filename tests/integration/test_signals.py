"""Signals as the container delivers them: SIGTERM to PID 1 (tini, which forwards it to the Python
driver only, as the Dockerfile starts it) drains and exits 0; a second signal exits at once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints, die_with_parent_process

from .service import (
    ServiceRun,
    assert_exactly,
    create_stream,
    efo,
    put_records,
    read_output,
    service_env,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration

TINI = shutil.which("tini")


@pytest.mark.skipif(TINI is None, reason="tini is not installed (.ci/run installs Debian's tini)")
def test_sigterm_to_tini_as_pid_one_reaches_only_python_which_drains_and_exits_0(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("tini"), unique("app")
    create_stream(kinesis_client, stream, 1)
    env = service_env(local_stack, stream=stream, app=app, output=tmp_path / "out", initial_position="TRIM_HORIZON")
    log_path = tmp_path / "efo.log"
    with log_path.open("wb") as log:
        # The Dockerfile's ENTRYPOINT: tini (no -g) forwards signals to its child only.
        tini = subprocess.Popen(
            [str(TINI), "-s", "--", sys.executable, "-m", "efo.cli", "run"],
            env=env,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent_process,
        )
    run = ServiceRun(env, log_path, process=tini)
    run.wait_for_event("service.ready")
    puts = put_records(kinesis_client, stream, 100, tag="pid1")
    wait_for_rows(tmp_path / "out", len(puts), run)
    tini.send_signal(signal.SIGTERM)  # what the kubelet does: PID 1 only
    assert tini.wait(60) == 0, run.tail()
    events = [e["event"] for e in run.events()]
    assert "driver.stopped" in events and "leases.released" in events
    assert "Py4JNetworkError" not in log_path.read_text()
    assert_exactly(read_output(tmp_path / "out"), puts)


def test_a_second_signal_exits_at_once_without_checkpointing_anything_uncommitted(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("twice"), unique("app")
    create_stream(kinesis_client, stream, 1)
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    entered = tmp_path / "sink-entered"
    (handlers / "slow_sink.py").write_text(
        f"import pathlib, time\ndef write(df, batch):\n    pathlib.Path({str(entered)!r}).touch()\n    time.sleep(30)\n"
    )
    env = service_env(
        local_stack,
        stream=stream,
        app=app,
        output=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_SINK="handler:slow_sink:write",
        PYTHONPATH=str(handlers) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    put_records(kinesis_client, stream, 50, tag="slow")
    run = ServiceRun(env, tmp_path / "efo.log").start()
    run.wait_for_event("service.ready")
    deadline = time.monotonic() + 60
    while not entered.exists():  # the first batch is inside the 30 s sink
        assert time.monotonic() < deadline, run.tail()
        time.sleep(0.1)
    assert run.process is not None
    run.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    started = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    assert run.process.wait(10) == 1
    assert time.monotonic() - started < 5
    assert "second signal, exiting at once" in run.log_path.read_text()
    assert not [e for e in run.events() if e["event"] == "batch.committed"]
    leases = efo(env, "leases", "--json")
    assert leases.code == 0, leases.stderr
    assert [lease["checkpoint"] for lease in json.loads(leases.stdout)] == ["TRIM_HORIZON"]
