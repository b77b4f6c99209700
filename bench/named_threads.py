"""Run ``efo`` with every Python thread's name given to the kernel, for bench/service_cpu.py.

Python 3.11 leaves every thread of a process named after the executable in ``/proc/<pid>/task/*/comm``,
so a thread's CPU time cannot be told apart by role. This sets each thread's kernel name (at most 15
bytes) to its Python name when it starts (``efo-service``: the service's asyncio loop;
``efo-arrow_0``: the driver's prefetch thread; ``MainThread``: the driver loop), then runs
``python -m efo.cli`` with the same arguments. It changes nothing else: efo itself (any commit of it)
is imported from ``PYTHONPATH`` as usual.

    python -m named_threads run        # bench/ on PYTHONPATH
"""

from __future__ import annotations

import ctypes
import runpy
import sys
import threading
from typing import Any

PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def set_native_name(name: str) -> None:
    _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def install() -> None:
    original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def bootstrap_inner(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
        set_native_name(self.name)
        return original(self, *args, **kwargs)

    threading.Thread._bootstrap_inner = bootstrap_inner  # type: ignore[attr-defined]
    set_native_name("MainThread")


if __name__ == "__main__":
    install()
    import efo

    sys.stderr.write(f"named_threads: efo from {efo.__file__}\n")
    sys.argv = ["efo", *sys.argv[1:]]
    runpy.run_module("efo.cli", run_name="__main__", alter_sys=True)
