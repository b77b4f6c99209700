"""The local stack picks its ports free, then starts its servers on them: a port can be taken in
between (by another test's server, or as a connection's ephemeral port). It is picked again."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from efo.devstack import stack
from efo.devstack.stack import LOOPBACK, LocalStack

pytestmark = pytest.mark.integration


def hand_out_taken(monkeypatch: pytest.MonkeyPatch, port: int, *, at_pick: int) -> None:
    """The stack's ``at_pick``-th free port (1: kinesis-local's, 2: the proxy's, 3: DynamoDB's,
    then again on a restart) is ``port``; the others are free."""
    picks = 0
    free_port = stack.free_port

    def pick() -> int:
        nonlocal picks
        picks += 1
        return port if picks == at_pick else free_port()

    monkeypatch.setattr(stack, "free_port", pick)


def test_a_port_taken_between_its_pick_and_its_server_s_start_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((LOOPBACK, 0))  # bound, not listening: nothing answers there, nobody else can bind it
        port = taken.getsockname()[1]
        hand_out_taken(monkeypatch, port, at_pick=3)  # kinesis-local, the proxy, then DynamoDB's: taken
        with LocalStack(log_dir=tmp_path) as endpoints:
            assert endpoints.dynamodb_port != port
            assert stack._port_open(endpoints.dynamodb_port)
        assert b"in use" in (tmp_path / "moto-dynamodb.log").read_bytes(), "the first DynamoDB did not start"


def test_a_port_another_server_listens_on_is_not_taken_for_its_own_server_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something else listening there answers a connection as the server would: readiness is
    the stack's own process holding the listening socket, not a port that answers. kinesis-local
    is waited for first (DynamoDB's server, started before it and waited for last, has mostly
    exited by then: the wait itself is tested below)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()  # another server: connections to the port succeed
        port = taken.getsockname()[1]
        hand_out_taken(monkeypatch, port, at_pick=1)  # kinesis-local's: taken
        with LocalStack(log_dir=tmp_path) as endpoints:
            assert endpoints.kinesis_port != port
            assert stack.listens(endpoints.kinesis_pid, endpoints.kinesis_port)
        assert b"EADDRINUSE" in (tmp_path / "kinesis-local.log").read_bytes(), "the first kinesis-local did not start"


def test_a_server_is_not_ready_while_another_process_listens_on_its_port(tmp_path: Path) -> None:
    import subprocess
    import sys

    log = tmp_path / "child.log"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind((LOOPBACK, 0))
        other.listen()
        port = other.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not stack.wait_listening(port, child, 0.5)
            with pytest.raises(stack.StackError, match="not ready"):
                stack._Child("child", child, log).wait_ready(port, 0.5)
        finally:
            child.kill()
            child.wait()


def test_listens_tells_the_process_holding_the_listening_socket(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((LOOPBACK, 0))
        port = server.getsockname()[1]
        assert not stack.listens(os.getpid(), port)  # bound, not listening
        server.listen()
        assert stack.listens(os.getpid(), port)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not stack.listens(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert not stack.listens(os.getpid(), port)
