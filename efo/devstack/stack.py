"""Start and stop the local dev stack: kinesis-local, the conformance proxy in front of it, moto (DynamoDB).

Used by pytest fixtures (children die with the test process) and by ``efo dev up`` (children outlive
the CLI; ``efo dev down`` finds them again through a state file).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

LOOPBACK = "127.0.0.1"
DEFAULT_REGION = "us-east-1"
# kinesis-local's SHARD_LIMIT: open shards across all its streams (every region and key; CreateStream beyond it
# is refused with LimitExceededException). 1,024 fits the benchmarks' 256 shards next to everything a test run creates.
DEFAULT_SHARD_LIMIT = 1024
DEFAULT_OPERATION_DELAY = "100ms"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
STATE_FILE_NAME = "stack.json"

# kinesis-local waits this long (default 500ms each) before a stream/consumer/shard change completes.
_DELAY_ENV_VARS = (
    "CREATE_STREAM_DURATION",
    "DELETE_STREAM_DURATION",
    "REGISTER_STREAM_CONSUMER_DURATION",
    "DEREGISTER_STREAM_CONSUMER_DURATION",
    "START_STREAM_ENCRYPTION_DURATION",
    "STOP_STREAM_ENCRYPTION_DURATION",
    "MERGE_SHARDS_DURATION",
    "SPLIT_SHARD_DURATION",
    "UPDATE_SHARD_COUNT_DURATION",
    "UPDATE_STREAM_MODE_DURATION",
)
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The stack (or one of its processes) could not be started or located."""


@dataclass(frozen=True)
class StackEndpoints:
    kinesis_endpoint: str  # the conformance proxy: clients always go through it
    kinesis_upstream_endpoint: str  # raw kinesis-local, for diagnostics only
    dynamodb_endpoint: str
    region: str
    kinesis_port: int
    proxy_port: int
    dynamodb_port: int
    kinesis_pid: int
    proxy_pid: int
    dynamodb_pid: int
    log_dir: str
    # None only in a state file written before the stack recorded it.
    shard_limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProcessRecord:
    """A started process as remembered in the state file; ``start_time`` guards against pid reuse."""

    name: str
    pid: int
    start_time: int
    log_path: str


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def devstack_dir() -> Path:
    return Path(os.environ.get("EFO_DEVSTACK_DIR") or repo_root() / "devstack")


def kinesis_local_dir(base: Path | None = None) -> Path:
    package = (base or devstack_dir()) / "node_modules" / "kinesis-local"
    if not (package / "main.js").is_file():
        raise StackError(
            f"kinesis-local is not installed at {package}; run `npm ci --prefix devstack` (or `make`) in the repo root"
        )
    return package


def ephemeral_ports() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (Linux's default if it does not say)."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


_PORTS = random.Random()


def free_port() -> int:
    """A loopback port free now, for a server started on it later, outside the ephemeral range: a
    port picked there (bind to 0) may become a client connection's own port before the server binds
    it. Random among the others, tried until one binds (a clash left is what callers retry)."""
    low, high = ephemeral_ports()
    for _ in range(64):
        port = _PORTS.randrange(10_000, 65_536)
        if low <= port <= high:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) from /proc/<pid>/stat; None if the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(record: ProcessRecord) -> bool:
    return process_start_time(record.pid) == record.start_time


def die_with_parent_process() -> None:
    """preexec_fn: the child gets SIGTERM when the thread that started it dies (Linux PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


#: TCP's LISTEN state in /proc/net/tcp{,6}.
_TCP_LISTEN = "0A"


def _listening_inodes(port: int) -> set[str] | None:
    """The inodes of the sockets listening on TCP ``port`` (any address, IPv4 or IPv6) in this
    network namespace; None where /proc does not tell (not Linux)."""
    inodes: set[str] = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
            fields = line.split()
            if fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if tables else None


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port``: a connection that
    succeeds could be another server's, picked the same free port (where /proc does not tell,
    that is all there is to go by)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return _port_open(port)
    if not inodes:
        return False
    sockets = {f"socket:[{inode}]" for inode in inodes}
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in sockets:
                        return True
                except OSError:  # closed meanwhile
                    continue
    except OSError:  # the process is gone
        return False
    return False


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until ``process`` listens on TCP ``port``: False if it ended first or ``timeout_s``
    passed."""
    deadline = time.monotonic() + timeout_s
    while not listens(process.pid, port):
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


#: What a server of the stack logs when its port is taken (waitress and asyncio: "Address already in use";
#: Node: EADDRINUSE; werkzeug: "is in use by another program").
_PORT_TAKEN = re.compile(rb"address already in use|EADDRINUSE|is in use by another program", re.IGNORECASE)
#: Starts of the stack, each on ports picked afresh, when a port picked free was taken before its
#: server bound it (by another process's server or by a connection's ephemeral port).
START_ATTEMPTS = 3


class PortTaken(StackError):
    """A server of the stack exited at start because its port was taken."""


class _Child:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path, log_offset: int = 0) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.log_offset = log_offset  # where this process's lines start in its (appended) log
        self.start_time = process_start_time(popen.pid) or 0

    def port_taken(self) -> bool:
        """Whether this process logged that its port was taken."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_offset)
                return bool(_PORT_TAKEN.search(log.read()))
        except OSError:
            return False

    def record(self) -> ProcessRecord:
        return ProcessRecord(self.name, self.popen.pid, self.start_time, str(self.log_path))

    def wait_ready(self, port: int, timeout_s: float, probe: Callable[[], bool] = lambda: True) -> None:
        """Until this process listens on ``port`` and ``probe()`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.popen.poll()
            if code is not None:
                error = PortTaken if self.port_taken() else StackError
                raise error(
                    f"{self.name} exited with code {code} during startup; log {self.log_path}:\n"
                    f"{_log_tail(self.log_path)}"
                )
            if listens(self.popen.pid, port) and probe():
                return
            time.sleep(0.05)
        raise StackError(
            f"{self.name} (pid {self.popen.pid}) not ready after {timeout_s:.0f}s; log {self.log_path}:\n"
            f"{_log_tail(self.log_path)}"
        )

    def stop(self, timeout_s: float) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout_s)


class LocalStack:
    """The local AWS stack. ``start()`` returns its endpoints; ``stop()`` is idempotent.

    ``die_with_parent`` (default) makes the children receive SIGTERM when the starting thread's
    process dies (Linux PDEATHSIG); ``efo dev up`` turns it off so the stack outlives the CLI.
    """

    def __init__(
        self,
        *,
        region: str = DEFAULT_REGION,
        kinesis_port: int | None = None,
        proxy_port: int | None = None,
        dynamodb_port: int | None = None,
        subscription_lifetime_s: float = 0.0,
        shard_limit: int = DEFAULT_SHARD_LIMIT,
        operation_delay: str = DEFAULT_OPERATION_DELAY,
        log_dir: Path | None = None,
        die_with_parent: bool = True,
        devstack: Path | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.region = region
        self._ports = (kinesis_port, proxy_port, dynamodb_port)
        self.subscription_lifetime_s = subscription_lifetime_s
        self.shard_limit = shard_limit
        self.operation_delay = operation_delay
        self.log_dir = log_dir
        self.die_with_parent = die_with_parent
        self.devstack = devstack
        self.ready_timeout_s = ready_timeout_s
        self._children: list[_Child] = []
        self.endpoints: StackEndpoints | None = None

    def __enter__(self) -> StackEndpoints:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def processes(self) -> list[ProcessRecord]:
        return [child.record() for child in self._children]

    def start(self) -> StackEndpoints:
        if self.endpoints is not None:
            return self.endpoints
        package = kinesis_local_dir(self.devstack)
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="efo-devstack-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start(package, log_dir, *(p or free_port() for p in self._ports))
            except PortTaken:
                if attempt == START_ATTEMPTS or all(self._ports):
                    raise
        raise AssertionError("unreachable")

    def _start(
        self, package: Path, log_dir: Path, kinesis_port: int, proxy_port: int, dynamodb_port: int
    ) -> StackEndpoints:
        try:
            kinesis = self._spawn(
                "kinesis-local",
                ["node", "-r", str(package.parent.parent / "loopback.cjs"), str(package / "main.js")],
                self._kinesis_env(package, kinesis_port),
                log_dir,
            )
            dynamodb = self._spawn(
                "moto-dynamodb",
                [sys.executable, "-m", "efo.devstack.dynamodb", "--port", str(dynamodb_port)],
                None,
                log_dir,
            )
            kinesis.wait_ready(kinesis_port, self.ready_timeout_s)
            upstream = f"http://{LOOPBACK}:{kinesis_port}"
            proxy = self._spawn(
                "efo-proxy",
                [
                    sys.executable,
                    "-m",
                    "efo.devstack.proxy",
                    "--port",
                    str(proxy_port),
                    "--upstream",
                    upstream,
                    "--subscription-lifetime-s",
                    str(self.subscription_lifetime_s),
                ],
                {"PYTHONPATH": _python_path()},
                log_dir,
            )
            proxy.wait_ready(
                proxy_port, self.ready_timeout_s, lambda: _http_ok(f"http://{LOOPBACK}:{proxy_port}/_efo/faults")
            )
            dynamodb.wait_ready(dynamodb_port, self.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.endpoints = StackEndpoints(
            kinesis_endpoint=f"http://{LOOPBACK}:{proxy_port}",
            kinesis_upstream_endpoint=upstream,
            dynamodb_endpoint=f"http://{LOOPBACK}:{dynamodb_port}",
            region=self.region,
            kinesis_port=kinesis_port,
            proxy_port=proxy_port,
            dynamodb_port=dynamodb_port,
            kinesis_pid=kinesis.popen.pid,
            proxy_pid=proxy.popen.pid,
            dynamodb_pid=dynamodb.popen.pid,
            log_dir=str(log_dir),
            shard_limit=self.shard_limit,
        )
        return self.endpoints

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        # Proxy first so it drops upstream subscriptions before kinesis-local goes away.
        for child in reversed(self._children):
            child.stop(timeout_s)
        self._children.clear()
        self.endpoints = None

    def _kinesis_env(self, package: Path, port: int) -> dict[str, str]:
        env = {
            "KINESIS_MOCK_PLAIN_PORT": str(port),
            # The TLS listener cannot be disabled; give it its own free loopback port.
            "KINESIS_MOCK_TLS_PORT": str(free_port()),
            "KINESIS_MOCK_CERT_PATH": str(package / "server.json"),
            "SHARD_LIMIT": str(self.shard_limit),
            "AWS_REGION": self.region,
            "AWS_ACCOUNT_ID": "000000000000",
        }
        env.update(dict.fromkeys(_DELAY_ENV_VARS, self.operation_delay))
        return env

    def _spawn(self, name: str, argv: Sequence[str], extra_env: dict[str, str] | None, log_dir: Path) -> _Child:
        log_path = log_dir / f"{name}.log"
        env = {**os.environ, **(extra_env or {})}
        with log_path.open("ab") as log_file:
            log_offset = log_file.tell()
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=log_dir,
                    start_new_session=True,
                    preexec_fn=die_with_parent_process if self.die_with_parent else None,
                )
            except OSError as exc:
                raise StackError(f"cannot start {name} ({argv[0]}): {exc}") from exc
        child = _Child(name, popen, log_path, log_offset)
        self._children.append(child)
        return child


def _python_path() -> str:
    existing = os.environ.get("PYTHONPATH")
    root = str(repo_root())
    return f"{root}{os.pathsep}{existing}" if existing else root


# State file for `efo dev up` / `down` / `status` ----------------------------------------------


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE_NAME


def write_state(state_dir: Path, endpoints: StackEndpoints, processes: Sequence[ProcessRecord]) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_path(state_dir)
    payload = {"endpoints": endpoints.to_json(), "processes": [asdict(p) for p in processes]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def read_state(state_dir: Path) -> tuple[StackEndpoints, list[ProcessRecord]] | None:
    path = state_path(state_dir)
    try:
        payload = json.loads(path.read_text())
        endpoints = StackEndpoints(**payload["endpoints"])
        processes = [ProcessRecord(**p) for p in payload["processes"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StackError(f"unreadable stack state file {path}: {exc}") from exc
    return endpoints, processes


def stop_processes(processes: Sequence[ProcessRecord], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, wait, then SIGKILL each recorded process that is still the one we started."""
    alive = [p for p in processes if is_running(p)]
    for record in alive:
        _signal(record, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in alive):
        time.sleep(0.05)
    for record in alive:
        if is_running(record):
            _signal(record, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in alive):
        time.sleep(0.05)
    survivors = [f"{p.name} (pid {p.pid})" for p in alive if is_running(p)]
    if survivors:
        raise StackError(f"processes did not exit: {', '.join(survivors)}")


def _signal(record: ProcessRecord, sig: signal.Signals) -> None:
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        pass
