"""A Spark Connect server for tests: the one the installed pyspark ships, on 127.0.0.1 only.

``with spark_connect_server(work_dir) as server: ... server.url ...`` starts it on a free port,
waits until it accepts connections and stops it afterwards (SIGTERM to its process group, then
SIGKILL). Everything it binds is loopback: gRPC (``spark.connect.grpc.binding.address``) and the
driver's own RPC and block-manager ports (``spark.driver.bindAddress``/``host``).

It runs ``bin/spark-submit --class SparkConnectServer`` directly, which is what
``sbin/start-connect-server.sh`` does in the foreground (``SPARK_NO_DAEMONIZE=1``) minus the
``spark-daemon.sh`` shell that stays in between: ``spark-submit`` and ``spark-class`` ``exec``
into java, so java *is* the child that got PDEATHSIG and dies with the test process, where a
``spark-daemon.sh`` parent would die alone and leave the JVM running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from efo.devstack.stack import LOOPBACK, die_with_parent_process, free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 120.0  # a cold JVM on a busy 2-core machine
STOP_TIMEOUT_S = 15.0

SERVER_CONF = {
    "spark.connect.grpc.binding.address": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.driver.host": LOOPBACK,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}


class ConnectServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class ConnectServer:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def listening_addresses(self) -> list[str]:
        """The local addresses (``ip:port``) the server's JVM listens on, from ``ss -ltnp``."""
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
        return [line.split()[3] for line in out.splitlines() if f"pid={self.process.pid}," in line]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)  # its own session: the group is the JVM and its launcher
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def spark_connect_server(
    work_dir: Path, *, conf: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S
) -> Iterator[ConnectServer]:
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = work_dir / "spark-connect.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONNECT_MODE": "0",  # as sbin/start-connect-server.sh: this is the server, not a client
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOG_DIR": str(work_dir),
            "SPARK_PID_DIR": str(work_dir),
            "SPARK_LOCAL_IP": LOOPBACK,
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    argv = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--name",
        "Spark Connect server",
        "--master",
        "local[1]",
        "--driver-memory",
        "512m",
    ]
    for key, value in {**SERVER_CONF, "spark.connect.grpc.binding.port": str(port), **(conf or {})}.items():
        argv += ["--conf", f"{key}={value}"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=work_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=die_with_parent_process,
        )
    server = ConnectServer(port, process, log_path)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _accepts(port):
            if process.poll() is not None:
                raise ConnectServerError(f"Spark Connect server exited {process.returncode}:\n{server.tail()}")
            if time.monotonic() > deadline:
                raise ConnectServerError(f"Spark Connect server not up after {start_timeout_s} s:\n{server.tail()}")
            time.sleep(0.25)
        yield server
    finally:
        _stop(process)
