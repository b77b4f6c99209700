"""The kinds of sink ``EFO_SINK`` names, declared once: the grammar the settings accept, what the
settings check against each other, and what the Spark side looks up to make one.

A kind is one entry of :data:`SINK_KINDS` here (what efo must know without pyspark: how its target
is written, whether it needs Spark, whether it writes a path) and one module on the Spark side,
``sparkbridge.sinks.<name>``, whose ``SINK`` class writes it (found by the kind's name, as Spark finds
the source by its package's name). Adding a sink is those two and nothing else.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Target(enum.Enum):
    """What follows ``<kind>:`` in the setting."""

    NONE = ""  # the kind alone (console)
    PATH = "<path or URI>"  # a directory Spark writes under: checked for its file system and a test write
    FUNCTION = "<module>:<function>"  # an importable function, found when the sink is made

    def accepts(self, text: str) -> bool:
        if self is Target.NONE:
            return not text
        if self is Target.PATH:
            return bool(text)
        return re.fullmatch(r"[\w.]+:\w+", text) is not None


@dataclass(frozen=True, slots=True)
class SinkKind:
    name: str
    target: Target
    #: Handed Spark DataFrames (a session is started); False: handed Arrow tables, no JVM at all.
    needs_spark: bool

    @property
    def grammar(self) -> str:
        return f"{self.name}:{self.target.value}" if self.target is not Target.NONE else self.name

    @property
    def writes_path(self) -> bool:
        return self.target is Target.PATH


#: Every sink kind, in the order the settings' help lists them.
SINK_KINDS: tuple[SinkKind, ...] = (
    SinkKind("parquet", Target.PATH, needs_spark=True),
    SinkKind("handler", Target.FUNCTION, needs_spark=True),
    SinkKind("arrow", Target.FUNCTION, needs_spark=False),
    SinkKind("console", Target.NONE, needs_spark=True),
)
_BY_NAME = {kind.name: kind for kind in SINK_KINDS}

#: What a sink setting takes, said the same way in every error and in the settings' help.
SINK_GRAMMAR = ", ".join(kind.grammar for kind in SINK_KINDS)


def sink_kind(name: str) -> SinkKind | None:
    return _BY_NAME.get(name)
