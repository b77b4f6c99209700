"""The service's small HTTP server: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

``/healthz`` (liveness) fails when restarting the pod is the cure: the event loop does not answer
within ``LOOP_ANSWER_TIMEOUT_S`` (something blocks it), or the service failed. ``/readyz`` fails
until the pod does its work: the consumer ACTIVE, the lease table read recently, the Spark session
up, every owned shard subscribed (a worker with no share is ready with none). Both answer JSON,
``{"status": "ok" | "failing", "checks": {name: {"ok": bool, "detail": str}}}``, with 200 or
503; every other path is 404. Checks run on the server's thread and never block for longer than
the loop timeout.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from efo.observability import METRICS, Metrics

log = structlog.get_logger("efo.health")

LOOP_ANSWER_TIMEOUT_S = 2.0

#: A check returns None when it passes, or what is wrong.
Check = Callable[[], str | None]

#: /readyz needs every one of these; one not registered yet fails as "not started".
READY_CHECKS = ("consumer", "table", "spark", "shards")


class Health:
    """What /healthz and /readyz answer; the parts that know register their checks."""

    def __init__(self) -> None:
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._lock = threading.Lock()

    def live_check(self, name: str, check: Check) -> None:
        with self._lock:
            self._live[name] = check

    def ready_check(self, name: str, check: Check) -> None:
        assert name in READY_CHECKS, name
        with self._lock:
            self._ready[name] = check

    def liveness(self) -> dict[str, str | None]:
        with self._lock:
            checks = dict(self._live)
        return {name: _run(check) for name, check in checks.items()}

    def readiness(self) -> dict[str, str | None]:
        with self._lock:
            checks = dict(self._ready)
        return {name: _run(checks[name]) if name in checks else "not started" for name in READY_CHECKS}


def _run(check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a check that fails to run is a failing check, never a dead server
        return f"{type(exc).__name__}: {exc}"


def loop_answers(loop_of: Callable[[], Any], timeout_s: float = LOOP_ANSWER_TIMEOUT_S) -> Check:
    """A check that the event loop runs a callback within ``timeout_s`` (not yet started: passes,
    the process is starting; closed: fails)."""

    def check() -> str | None:
        loop = loop_of()
        if loop is None:
            return None
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:
            return "the event loop is closed"
        if not answered.wait(timeout_s):
            return f"the event loop did not answer within {timeout_s:g} s"
        return None

    return check


def _body(results: dict[str, str | None]) -> tuple[int, bytes]:
    ok = all(detail is None for detail in results.values())
    checks = {name: {"ok": detail is None, "detail": detail or "ok"} for name, detail in results.items()}
    body = json.dumps({"status": "ok" if ok else "failing", "checks": checks}, sort_keys=True).encode()
    return (200 if ok else 503), body


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port, served from a daemon thread."""

    def __init__(self, health: Health, metrics: Metrics = METRICS, host: str = "0.0.0.0", port: int = 0) -> None:
        self.health = health
        self.metrics = metrics
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the default writes plain text to stderr, in the middle of the JSON log

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        metrics.ready.set_function(lambda: float(all(detail is None for detail in health.readiness().values())))
        self._thread = threading.Thread(target=self._http.serve_forever, name="efo-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("http.serving", port=self.port, paths=["/metrics", "/healthz", "/readyz"])
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            status, content_type, body = 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        elif path in ("/healthz", "/readyz"):
            results = self.health.liveness() if path == "/healthz" else self.health.readiness()
            status, body = _body(results)
            content_type = "application/json"
        else:
            status, content_type = 404, "text/plain; charset=utf-8"
            body = b"not found: this server answers /metrics, /healthz and /readyz\n"
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
