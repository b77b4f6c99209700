"""The one seam between efo and its Spark side (the package ``sparkbridge``).

efo never imports sparkbridge: sparkbridge imports efo (the service, the settings, the Arrow
columns), so an import the other way would be a loop between the two packages, hidden only by being
lazy. What efo needs of Spark (``efo run`` and ``efo doctor``'s sink checks) it declares here as
:class:`SparkSide`; sparkbridge implements it in the module named by :data:`IMPLEMENTATION`, found
by name when a command needs it (pyspark only with a Spark session, which the arrow sink never
starts, and never on importing efo). The Structured Streaming source (``pyspark_efo``) is found by
name the same way, by Spark.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from efo.config import Settings, SinkSpec
from efo.errors import ConfigError

#: The module that implements :class:`SparkSide`, as the object ``SPARK_SIDE`` in it.
IMPLEMENTATION = "sparkbridge.side"


@runtime_checkable
class SparkSide(Protocol):
    """What efo asks of the Spark side. Sessions are opaque here (``Any``): efo never types pyspark."""

    def run(self, settings: Settings) -> int:
        """``efo run``: the service in this process until it stops; returns the exit code."""
        ...

    def check_sink(self, spec: SinkSpec) -> None:
        """Raise :class:`efo.errors.EfoError` if the sink cannot be made (its module, its function)."""
        ...

    def start_session(self, settings: Settings, app_name: str) -> Any:
        """A Spark session as ``efo run`` starts it; the caller stops it."""
        ...

    def require_filesystems(self, spark: Any, paths: list[tuple[str, str]]) -> None:
        """Raise :class:`ConfigError` for the first ``(setting, path)`` whose file system Spark lacks."""
        ...

    def require_writable(self, spark: Any, paths: list[tuple[str, str]]) -> None:
        """Write and delete a probe file under each path; raise :class:`efo.errors.EfoError` naming why not."""
        ...


def load() -> SparkSide:
    """The Spark side, imported now (pyspark is not: it loads with the first Spark session). A
    side that does not import is a :class:`ConfigError` saying what to install, as a session
    started without the ``spark`` extra is (sparkbridge.session.build_session)."""
    try:
        module = importlib.import_module(IMPLEMENTATION)
    except ImportError as exc:
        raise ConfigError(
            f"the Spark side ({IMPLEMENTATION}) does not import: {exc}; install efo with its spark extra "
            "(pip install 'efo[spark]')"
        ) from None
    side = getattr(module, "SPARK_SIDE", None)
    if not isinstance(side, SparkSide):
        raise TypeError(f"{IMPLEMENTATION}.SPARK_SIDE does not implement efo.spark_side.SparkSide: {side!r}")
    return side
