"""DynamoDB for the local stack: moto's server, with one request at a time.

moto checks a conditional write's condition and applies its update without a lock, so two
concurrent conditional writes on one item can both succeed (measured with moto 5.2.5: in 6 of 200
races of four writers, more than one won). DynamoDB never lets that happen, and lease fencing
depends on it: two workers must never both take a lease at the same counter. This server wraps
moto's WSGI application in a lock, which makes every request atomic, as on AWS. (About 130
conditional writes a second here, what moto managed concurrently anyway.)

It also counts the requests it serves by operation, for the measurements of what efo costs in
DynamoDB: ``GET /_efo/requests`` answers ``{"Query": n, "UpdateItem": n, ...}``.

And it injects faults, for the chaos tests: ``POST /_efo/faults`` with a rule of
:mod:`efo.devstack.faults` whose action is ``error`` (``{"operation": "UpdateItem", "action":
"error", "count": 5}`` answers the next five UpdateItem requests with 400
ProvisionedThroughputExceededException, as DynamoDB throttles; ``"status": 500, "error_code":
"InternalServerError"`` for a server error; ``"operation": "*"`` for any request). ``GET`` lists the
rules still to fire, ``DELETE`` clears them. ``efo.devstack.faults.FaultClient`` speaks this API.

Run: ``python -m efo.devstack.dynamodb --port P`` (binds 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

from efo.devstack.faults import FaultRule, FaultRules, RuleError

LOOPBACK = "127.0.0.1"
REQUESTS_PATH = "/_efo/requests"
FAULTS_PATH = "/_efo/faults"
ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
DEFAULT_ERROR_CODE = "ProvisionedThroughputExceededException"
STREAM_FIELDS = frozenset({"shard_id", "after_events", "stall_s"})  # of SubscribeToShard rules only

StartResponse = Callable[..., Any]


def _json(
    start_response: StartResponse, status: str, payload: object, headers: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers])
    return [body]


def _body(environ: dict[str, Any]) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    return bytes(environ["wsgi.input"].read(length)) if length > 0 else b""


def _dynamodb_error(start_response: StartResponse, rule: FaultRule) -> list[bytes]:
    """An error as DynamoDB answers it (JSON 1.0): botocore raises ClientError with this code."""
    status = f"{rule.status} {'Internal Server Error' if rule.status >= 500 else 'Bad Request'}"
    payload = {"__type": ERROR_PREFIX + rule.error_code, "message": rule.message}
    return _json(start_response, status, payload, [("x-amzn-ErrorType", rule.error_code)])


class Serialized:
    """A WSGI application that runs one request at a time (the whole response, body included),
    counts them by operation, and answers with an injected error while a fault rule matches."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.faults = FaultRules()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        path, method = environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")
        if path == REQUESTS_PATH and method == "GET":
            with self._lock:
                return _json(start_response, "200 OK", dict(self.requests))
        if path == FAULTS_PATH:
            return self._faults(environ, str(method), start_response)
        with self._lock:
            target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
            operation = target.rsplit(".", 1)[-1] or "other"
            self.requests[operation] += 1
            rule = self.faults.take(operation, None)
            if rule is not None:
                _body(environ)  # read, so that the connection can carry the next request
                return _dynamodb_error(start_response, rule)
            return list(self._app(environ, start_response))

    def _faults(self, environ: dict[str, Any], method: str, start_response: StartResponse) -> list[bytes]:
        with self._lock:
            if method == "GET":
                return _json(start_response, "200 OK", self.faults.to_json())
            if method == "DELETE":
                self.faults.clear()
                return _json(start_response, "200 OK", [])
            if method != "POST":
                return _json(start_response, "405 Method Not Allowed", {"error": "GET, POST or DELETE"})
            try:
                raw = json.loads(_body(environ) or b"null")
                if not isinstance(raw, dict) or raw.get("action") != "error":
                    raise RuleError("DynamoDB faults take action 'error' only")
                meaningless = sorted(STREAM_FIELDS & set(raw))
                if meaningless:
                    raise RuleError(f"DynamoDB faults have no {meaningless}")
                raw.setdefault("error_code", DEFAULT_ERROR_CODE)
                rule = self.faults.add(raw)
            except ValueError as exc:  # RuleError too
                return _json(start_response, "400 Bad Request", {"error": str(exc)})
            return _json(start_response, "200 OK", rule.to_json())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(LOOPBACK, args.port, Serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
