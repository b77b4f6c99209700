"""What the benchmarks share: the command line they print, their JSON results for bench/run_all.py,
a hermetic AWS environment, the synthetic server, and ``efo run`` as a child process."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REGION = "us-east-1"


def command_line() -> str:
    """How this benchmark was started, as one would type it from the repository root."""
    return "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def write_json(path: str | None, results: dict[str, Any]) -> None:
    """The figures bench/run_all.py checks against the goals (``--json PATH``), with the command."""
    if path:
        Path(path).write_text(json.dumps({"command": command_line(), **results}, indent=1))


def hermetic_aws_environment() -> None:
    """Dummy credentials; no shared config files; never ask an instance metadata service."""
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/efo-bench",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/efo-bench",
        }
    )
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)


def pin_cpus(no_pin: bool) -> tuple[int | None, int | None]:
    """(client CPU, server CPU): this process on the first CPU, the server on the second."""
    cpus = sorted(os.sched_getaffinity(0))
    if no_pin or len(cpus) < 2:
        return None, None
    os.sched_setaffinity(0, {cpus[0]})
    return cpus[0], cpus[1]


def start_synthetic_server(cpu: int | None, *, hold: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """bench/synthetic_server.py on a free loopback port; it exits when this process does."""
    command = [sys.executable, str(BENCH / "synthetic_server.py"), "--port", "0"]
    if cpu is not None:
        command += ["--cpu", str(cpu)]
    if hold:
        command += ["--hold"]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdout is not None
    line = server.stdout.readline().decode().strip()
    if not line.startswith("PORT "):
        server.kill()
        raise RuntimeError(f"the synthetic server did not start: {line!r}")
    return server, f"http://127.0.0.1:{line.split()[1]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_dynamodb(
    workdir: Path, module: str = "efo.devstack.dynamodb", *args: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A local DynamoDB alone on a free loopback port: the stack's (moto behind a lock, metered), or
    ``efo.devstack.dynamodb_local`` (DynamoDB Local behind a meter; in a private network namespace)."""
    from efo.devstack.stack import die_with_parent_process, wait_listening

    port = free_port()
    with (workdir / "dynamodb.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(port), *args],
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent_process,
        )
    if not wait_listening(port, process, 90):
        process.kill()
        raise RuntimeError(f"the local DynamoDB did not start; see {workdir / 'dynamodb.log'}")
    return process, f"http://127.0.0.1:{port}"


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a process (``RssAnon``: its anonymous part, no code or mapped files)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def efo_env(**settings: str) -> dict[str, str]:
    """The environment of an ``efo run`` child: this one without EFO_*, dummy credentials, JSON
    logs, bench/ importable (its arrow sinks), and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFO_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_EC2_METADATA_DISABLED": "true",
            "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)]),
            "EFO_LOG__FORMAT": "json",
            **settings,
        }
    )
    return env


class EfoProcess:
    """One ``efo run`` with its JSON log in a file; it dies with this process."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        cpus: set[int] | None = None,
        *,
        cwd: Path | None = None,
        module: str = "efo.cli",
        args: tuple[str, ...] = (),
    ) -> None:
        """``module``: what ``python -m`` runs with the argument ``run`` (bench/named_threads.py wraps efo.cli),
        followed by ``args`` (e.g. ``--config FILE``)."""
        from efo.devstack.stack import die_with_parent_process

        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)

        def prepare() -> None:
            die_with_parent_process()
            if cpus:
                os.sched_setaffinity(0, cpus)

        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, "run", *args],
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=prepare,
                cwd=cwd,
            )
        self.pid = self.process.pid

    def events(self, name: str | None = None) -> Iterator[dict[str, Any]]:
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if name is None or event.get("event") == name:
                    yield event

    def wait_for(self, name: str, timeout_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events(name):
                return event
            if self.process.poll() is not None:
                raise RuntimeError(f"efo run exited {self.process.returncode} before {name}; see {self.log_path}")
            time.sleep(0.2)
        raise RuntimeError(f"no {name} from efo run within {timeout_s} s; see {self.log_path}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)  # the process only: never its group
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def at(event: dict[str, Any]) -> float:
    """A log event's timestamp, in epoch seconds."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank of sorted ``values``."""
    if not values:
        return float("nan")
    rank = max(0, min(len(values) - 1, round(q / 100 * len(values) + 0.5) - 1))
    return values[rank]
