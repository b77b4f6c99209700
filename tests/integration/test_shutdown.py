"""Shutdown and sink failure: a graceful stop commits and checkpoints what it took, a failing sink
stops the service without moving a checkpoint past the failed batch."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .service import (
    ServiceRun,
    arrow_env,
    assert_exactly,
    create_stream,
    put_records,
    read_output,
    service_env,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration


def test_sigterm_mid_stream_drains_and_restart_delivers_the_rest_exactly_once(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("term"), unique("app")
    create_stream(kinesis_client, stream, 2)
    env = arrow_env(
        local_stack,
        stream=stream,
        app=app,
        sink_dir=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_CHECKPOINT__INTERVAL_S="30",  # only the shutdown flush can save the position
    )
    puts = put_records(kinesis_client, stream, 100, tag="t0")
    run = ServiceRun(env, tmp_path / "first.log").start()
    run.wait_for_event("batch.committed")
    # Keep producing while the service stops, and for longer than it may read on after the signal
    # (its subscriptions are younger than 5 s: Coordinator._read_on), so the stop lands mid-stream.
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(
            lambda: [put_records(kinesis_client, stream, 60, tag=f"t{i}") for i in range(1, 41) if not time.sleep(0.2)]
        )
        time.sleep(1.0)
        started = time.monotonic()
        assert run.stop() == 0
        assert time.monotonic() - started < 30
        puts += [p for batch in producing.result() for p in batch]
    events = [e["event"] for e in run.events()]
    assert "service.stopping" in events and "leases.released" in events
    committed_before = len(read_output(tmp_path / "out"))
    assert 0 < committed_before < len(puts), "the stop should land mid-stream"

    restarted = ServiceRun(env, tmp_path / "second.log").start()
    wait_for_rows(tmp_path / "out", len(puts), restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts)


def test_failing_sink_stops_with_exit_1_and_no_checkpoint_moves_past_the_failed_batch(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("sinkfail"), unique("app")
    create_stream(kinesis_client, stream, 1)
    puts = put_records(kinesis_client, stream, 200, tag="f")
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "broken_sink.py").write_text(
        "def write(table, batch):\n    raise RuntimeError(f'warehouse unavailable for {batch.batch_id}')\n"
    )
    common = {"EFO_SINK_RETRY__MAX_ATTEMPTS": "2", "EFO_SINK_RETRY__RETRY_BACKOFF_S": "0.1"}
    env = arrow_env(
        local_stack,
        stream=stream,
        app=app,
        sink_dir=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        **common,
    )
    env.update({"EFO_SINK": "arrow:broken_sink:write", "PYTHONPATH": f"{handlers}{os.pathsep}{env['PYTHONPATH']}"})
    failing = ServiceRun(env, tmp_path / "failing.log").start()
    assert failing.process is not None
    assert failing.process.wait(120) == 1
    log = failing.log_path.read_text()
    line = "efo: sink (EFO_SINK) = 'arrow:broken_sink:write' failed on batch"
    assert line in log and "after 2 attempts: RuntimeError: warehouse unavailable" in log
    assert "Traceback" not in log

    fixed = ServiceRun(
        arrow_env(
            local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="TRIM_HORIZON", **common
        ),
        tmp_path / "fixed.log",
    ).start()
    wait_for_rows(tmp_path / "out", len(puts), fixed)
    assert fixed.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts)


def test_sigterm_while_the_sink_hangs_exits_within_the_shutdown_timeout_with_exit_1_and_loses_nothing(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("hang"), unique("app")
    create_stream(kinesis_client, stream, 1)
    puts = put_records(kinesis_client, stream, 50, tag="h")
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    entered = tmp_path / "entered"
    (handlers / "hanging_sink.py").write_text(
        "import pathlib, time\n"
        f"def write(df, batch):\n    pathlib.Path({str(entered)!r}).touch()\n    time.sleep(120)\n"
    )
    shutdown_timeout_s = 3.0
    env = service_env(
        local_stack,
        stream=stream,
        app=app,
        output=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_SINK="handler:hanging_sink:write",
        EFO_SHUTDOWN_TIMEOUT_S=str(shutdown_timeout_s),
        PYTHONPATH=str(handlers),
    )
    hanging = ServiceRun(env, tmp_path / "hanging.log").start()
    deadline = time.monotonic() + 90
    while not entered.exists():
        assert time.monotonic() < deadline and hanging.process is not None and hanging.process.poll() is None, (
            hanging.tail()
        )
        time.sleep(0.2)
    started = time.monotonic()
    code = hanging.stop(timeout_s=60)
    stopped_in_s = time.monotonic() - started
    assert code == 1, hanging.tail()
    assert stopped_in_s < shutdown_timeout_s + 7, f"stopped {stopped_in_s:.1f} s after SIGTERM"
    log = hanging.log_path.read_text()
    assert "efo: " in log and "Traceback" not in log

    fixed = ServiceRun(  # the sink mended: the JVM-free one, as the restart is what is checked
        arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="TRIM_HORIZON"),
        tmp_path / "fixed.log",
    ).start()
    wait_for_rows(tmp_path / "out", len(puts), fixed)
    assert fixed.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts)


def test_sigterm_commits_the_batch_being_filled_at_once_instead_of_waiting_for_max_wait(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    """Nothing more comes in once the stop begins: the open batch must close with what it holds,
    be committed and checkpointed now, not when ``batch.max_wait_s`` after its first record ends
    (the next owner of the shards waits for the release as long)."""
    stream, app = unique("cut"), unique("app")
    create_stream(kinesis_client, stream, 1)
    puts = put_records(kinesis_client, stream, 50, tag="c0")
    shutdown_timeout_s = 20.0
    env = arrow_env(
        local_stack,
        stream=stream,
        app=app,
        sink_dir=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_BATCH__MAX_WAIT_S="120",  # the open batch would close two minutes after its first record
        EFO_CHECKPOINT__INTERVAL_S="120",  # only the shutdown flush can save the position
        EFO_SHUTDOWN_TIMEOUT_S=str(shutdown_timeout_s),
    )
    run = ServiceRun(env, tmp_path / "first.log").start()
    run.wait_for_event("shard.first_event")
    time.sleep(1.0)  # the backlog's event is in the batch being filled
    assert not read_output(tmp_path / "out"), "no batch may close before max_wait_s"
    started = time.monotonic()
    assert run.stop() == 0, run.tail()
    stopped_in_s = time.monotonic() - started
    assert stopped_in_s < shutdown_timeout_s / 2, f"stopped {stopped_in_s:.1f} s after SIGTERM"
    assert_exactly(read_output(tmp_path / "out"), puts)

    puts += put_records(kinesis_client, stream, 10, tag="c1")
    restarted = ServiceRun({**env, "EFO_BATCH__MAX_WAIT_S": "1"}, tmp_path / "second.log").start()
    wait_for_rows(tmp_path / "out", len(puts), restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts)  # the stop checkpointed the batch it committed


def test_sigterm_just_after_subscribing_reads_on_and_commits_what_it_read_meanwhile(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    """Kinesis refuses the next owner's SubscribeToShard until 5 s after this worker's last one, so a
    worker stopped a second after subscribing reads on until then (``service.reading_on``) and its
    sink commits what was written meanwhile, checkpointed before the release: the shard is read
    while the next owner could not read it anyway. It used to stop reading at the signal."""
    stream, app = unique("readon"), unique("app")
    create_stream(kinesis_client, stream, 1)
    puts = put_records(kinesis_client, stream, 10, tag="before")
    env = arrow_env(
        local_stack,
        stream=stream,
        app=app,
        sink_dir=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_BATCH__MAX_WAIT_S="0.3",
        EFO_CHECKPOINT__INTERVAL_S="60",  # only the stop's flush saves the position
    )
    run = ServiceRun(env, tmp_path / "first.log").start()
    run.wait_for_event("shard.first_event")
    assert run.process is not None
    run.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    late: list[Any] = []  # put a second or more after the signal
    for i in range(12):
        batch = put_records(kinesis_client, stream, 5, tag=f"after{i}")
        (late if time.monotonic() - signalled >= 1.0 else puts).extend(batch)
        time.sleep(0.2)
    assert run.process.wait(30) == 0, run.tail()  # a second signal would exit at once
    reading_on = [e for e in run.events() if e["event"] == "service.reading_on"]
    assert reading_on and 0 < reading_on[0]["seconds"] <= 5, reading_on
    committed = {row["sequence_number"] for row in read_output(tmp_path / "out")}
    assert committed & {put.sequence_number for put in late}, "nothing written after the signal was committed"

    restarted = ServiceRun(env, tmp_path / "second.log").start()  # from the stop's checkpoint: nothing lost
    restarted.wait_for_event("service.ready")
    wait_for_rows(tmp_path / "out", len(puts) + len(late), restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts + late)
