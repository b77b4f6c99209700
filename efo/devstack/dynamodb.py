"""DynamoDB for the local stack: moto's server, with one request at a time.

moto checks a conditional write's condition and applies its update without a lock, so two
concurrent conditional writes on one item can both succeed (measured with moto 5.2.5: in 6 of 200
races of four writers, more than one won). DynamoDB never lets that happen, and lease fencing
depends on it: two workers must never both take a lease at the same counter. This server wraps
moto's WSGI application in a lock, which makes every request atomic, as on AWS. (About 130
conditional writes a second here, what moto managed concurrently anyway.)

It also counts the requests it serves by operation, for the measurements of what efo costs in
DynamoDB: ``GET /_efo/requests`` answers ``{"Query": n, "UpdateItem": n, ...}``.

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

LOOPBACK = "127.0.0.1"
REQUESTS_PATH = "/_efo/requests"


class Serialized:
    """A WSGI application that runs one request at a time (the whole response, body included),
    and counts them by operation."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") == REQUESTS_PATH and environ.get("REQUEST_METHOD") == "GET":
            with self._lock:
                body = json.dumps(dict(self.requests)).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        with self._lock:
            target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
            self.requests[target.rsplit(".", 1)[-1] or "other"] += 1
            return list(self._app(environ, start_response))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(LOOPBACK, args.port, Serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
