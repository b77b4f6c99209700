"""sparkbridge's implementation of efo's seam to the Spark side (:class:`efo.spark_side.SparkSide`):
what ``efo run`` and ``efo doctor`` reach through :func:`efo.spark_side.load`. Nothing here but the
names efo asks for; each is the function of the module that owns it."""

from __future__ import annotations

from typing import Any

from efo.config import Settings, SinkSpec
from sparkbridge import app, filesystems, session, sinks


class SparkBridge:
    def run(self, settings: Settings) -> int:
        return app.run(settings)

    def check_sink(self, spec: SinkSpec) -> None:
        sinks.make_sink(spec)

    def start_session(self, settings: Settings, app_name: str) -> Any:
        return session.build_session(settings, app_name=app_name)

    def require_filesystems(self, spark: Any, paths: list[tuple[str, str]]) -> None:
        filesystems.require_filesystems(spark, paths)

    def require_writable(self, spark: Any, paths: list[tuple[str, str]]) -> None:
        filesystems.require_writable(spark, paths)


SPARK_SIDE = SparkBridge()
