"""Settings: environment variables with prefix ``EFO_`` and/or a YAML file; the environment wins,
and a command-line flag (``efo ... --stream``) wins over both.

Nested settings use ``__`` in the environment: YAML ``pool.max_pending_bytes`` is
``EFO_POOL__MAX_PENDING_BYTES``. Sizes are in bytes, durations in seconds (``_s`` suffix).
Validation happens once, before any AWS call; a failure is a :class:`ConfigError` whose message
names the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, InitSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from efo.errors import ConfigError
from efo.sink_kinds import SINK_GRAMMAR, SinkKind, sink_kind

ENV_PREFIX = "EFO_"
NESTED_DELIMITER = "__"


@dataclass(frozen=True, slots=True)
class InitialPosition:
    """Where shards without a checkpoint start, at the application's first start only."""

    kind: Literal["LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"]
    timestamp: datetime | None = None

    @classmethod
    def parse(cls, text: str) -> InitialPosition:
        value = text.strip()
        upper = value.upper()
        if upper in ("LATEST", "TRIM_HORIZON"):
            return cls(upper)  # type: ignore[arg-type]
        if upper.startswith("AT_TIMESTAMP:"):
            raw = value.split(":", 1)[1].strip()
            try:
                stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(
                    f"AT_TIMESTAMP needs an ISO-8601 time such as 2026-01-31T12:00:00Z, got {raw!r}"
                ) from None
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
            return cls("AT_TIMESTAMP", stamp.astimezone(UTC))
        raise ValueError("allowed: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>")

    def __str__(self) -> str:
        if self.timestamp is not None:
            return f"AT_TIMESTAMP:{self.timestamp.isoformat()}"
        return self.kind


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: What every duration setting takes, said the same way in every error (and in the chart's schema).
DURATION_GRAMMAR = "a number of seconds (2.5), or a number with its unit s, m, h or d (90s, 5m, 2h, 1d)"
DURATION_ALLOWED = f"allowed: a duration: {DURATION_GRAMMAR}"
#: The same grammar for JSON Schema (the chart's values.schema.json).
DURATION_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[smhd]?\s*$"


def duration_s(value: object) -> float:
    """A duration in seconds from a number (seconds) or a text with its unit (``5m``), or a
    ValueError that says what is allowed (:data:`DURATION_ALLOWED`)."""
    if isinstance(value, bool):
        raise ValueError(DURATION_ALLOWED)
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(DURATION_ALLOWED)
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def _duration_parser(minimum_s: float, *, inclusive: bool) -> Callable[[object], float]:
    """A duration setting's parser: its bound said as a duration's, in the words of every other."""
    bound = f"{'at least' if inclusive else 'greater than'} {minimum_s:g}"
    allowed = f"allowed: a duration {bound}: {DURATION_GRAMMAR}"

    def parse(value: object) -> float:
        try:
            seconds = duration_s(value)
        except ValueError:
            raise ValueError(allowed) from None
        if not (seconds >= minimum_s if inclusive else seconds > minimum_s):  # NaN is neither
            raise ValueError(allowed)
        return seconds

    return parse


def _duration_schema(minimum_s: float, *, inclusive: bool) -> dict[str, Any]:
    limit = {"minimum": minimum_s} if inclusive else {"exclusiveMinimum": minimum_s}
    return {"anyOf": [{"type": "number", **limit}, {"type": "string", "pattern": DURATION_PATTERN}]}


def parse_duration_s(text: str) -> float:
    """``60``, ``2.5``, ``90s``, ``15m``, ``2h``, ``1d``: seconds, more than 0."""
    return _positive_duration_s(text)


_positive_duration_s = _duration_parser(0, inclusive=False)

#: A duration setting (``..._s``) greater than 0: a number of seconds, or a text with its unit (``5m``).
PositiveDurationS = Annotated[
    float,
    BeforeValidator(_positive_duration_s),
    WithJsonSchema(_duration_schema(0, inclusive=False)),
]
#: A duration setting that may be 0.
DurationS = Annotated[
    float, BeforeValidator(_duration_parser(0, inclusive=True)), WithJsonSchema(_duration_schema(0, inclusive=True))
]


@dataclass(frozen=True, slots=True)
class SinkSpec:
    """A sink setting parsed: its kind (one of :data:`efo.sink_kinds.SINK_KINDS`) and its target."""

    kind: str
    target: str = ""

    @classmethod
    def parse(cls, text: str) -> SinkSpec:
        name, _, rest = text.strip().partition(":")
        kind = sink_kind(name)
        if kind is not None and kind.target.accepts(rest):
            return cls(name, rest)
        raise ValueError(f"allowed: {SINK_GRAMMAR}")

    @property
    def declared(self) -> SinkKind:
        """The kind's declaration: what it takes, whether it needs Spark, whether it writes a path."""
        kind = sink_kind(self.kind)
        assert kind is not None, "a SinkSpec is made by parse, from a declared kind"
        return kind

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}" if self.target else self.kind


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSettings(_Section):
    max_pending_records: int = Field(
        200_000, ge=1, description="Records read from Kinesis and not yet committed by the sink, at most."
    )
    max_pending_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="Bytes of record data read and not yet committed, at most."
    )
    reserved_records_per_shard: int = Field(
        1_000, ge=0, description="Part of the pool kept for each shard so a hot shard cannot starve the rest."
    )
    reserved_bytes_per_shard: int = Field(1024 * 1024, ge=0, description="The same reserve, in bytes.")
    backpressure_timeout_s: PositiveDurationS = Field(
        30.0,
        description="A subscription waiting this long for budget closes its stream and resubscribes later.",
    )
    max_uncheckpointed_records: int = Field(
        1_000_000,
        ge=1,
        description="Committed records whose checkpoint is not yet written; at this many, reading pauses.",
    )


#: The largest batch.max_bytes: the bridge copies a batch's payloads into one Arrow
#: ``binary`` column (32-bit offsets, at most 2 GiB of values); half of that leaves room for the one
#: event a batch may hold past its bound.
MAX_BATCH_BYTES: Final = 1 << 30


class BatchSettings(_Section):
    max_records: int = Field(50_000, ge=1, description="A batch closes at this many records.")
    max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        le=MAX_BATCH_BYTES,
        description="A batch closes at this many bytes of data (at most 1 GiB: the batch's data column is an "
        "Arrow binary column, whose 32-bit offsets hold 2 GiB, and a batch may pass this by one event).",
    )
    max_wait_s: PositiveDurationS = Field(5.0, description="A batch closes this long after its first record arrived.")
    stall_timeout_s: PositiveDurationS = Field(
        600.0,
        description="A batch still in the sink this long after it was taken stops the worker (exit 1), "
        "so that its shards move to other workers.",
    )


class CheckpointSettings(_Section):
    interval_s: PositiveDurationS = Field(
        5.0, description="Checkpoints are coalesced per shard and written at most this often."
    )


class LeaseSettings(_Section):
    heartbeat_interval_s: PositiveDurationS = Field(
        2.0, description="How often this worker's heartbeat row is written."
    )
    failover_s: PositiveDurationS = Field(
        10.0,
        description="A worker whose heartbeat has not changed for this long is dead; its leases are taken. At "
        "least three heartbeat intervals.",
    )
    sync_interval_s: PositiveDurationS = Field(
        1.0,
        description="How often the lease cycle runs: a strongly consistent read of the version row and "
        "eventually consistent reads of two other workers' heartbeat rows (the lease rows only when a "
        "version moved); leases taken by others are dropped, free ones claimed, handovers and resets "
        "applied, shards balanced.",
    )
    full_read_interval_s: PositiveDurationS = Field(
        300.0,
        description="Every lease row is read again about this often (at a random moment of its second "
        "half), eventually consistent, even when its version did not move: a safety net for a change whose "
        "version write was lost (its writer died in between).",
    )
    delete_finished_after_s: PositiveDurationS = Field(
        300.0,
        description="A finished shard's lease is deleted this long after it finished, once every child has "
        "a lease and its parents' leases are gone (the KCL's rules), so the table does not grow with the "
        "stream's resharding history.",
    )
    max_leases_per_worker: int = Field(0, ge=0, description="At most this many shards per worker (0: no limit).")
    max_steals_per_cycle: int = Field(
        1, ge=0, description="Handover requests a worker short of its share may have open at once (0: never steal)."
    )

    @model_validator(mode="after")
    def _failover_outlasts_heartbeats(self) -> LeaseSettings:
        # A worker trusts its leases for failover_s less one interval after a heartbeat's send: at
        # least two intervals, so that a heartbeat may take up to one to land (efo.worker.liveness).
        if self.failover_s < 3 * self.heartbeat_interval_s:
            raise ValueError(
                f"lease.failover_s (EFO_LEASE__FAILOVER_S) = {self.failover_s} must be at least three times "
                f"lease.heartbeat_interval_s (EFO_LEASE__HEARTBEAT_INTERVAL_S) = {self.heartbeat_interval_s}"
            )
        return self


class SubscriptionSettings(_Section):
    read_timeout_s: PositiveDurationS = Field(
        30.0, description="A subscription silent for this long is cancelled and renewed."
    )
    backoff_initial_s: PositiveDurationS = Field(0.3, description="First retry delay of a failed subscription.")
    backoff_max_s: PositiveDurationS = Field(5.0, description="Longest retry delay; retries never give up.")


class ShardSettings(_Section):
    sync_interval_s: PositiveDurationS = Field(
        10.0,
        description="How often one worker (the first live one by name) calls ListShards to look for new "
        "shards; the others learn of splits and merges from the leases it writes, and any worker whose "
        "shard ends writes its children's leases from the shard's last event.",
    )


class SinkSettings(_Section):
    max_attempts: int = Field(5, ge=1, description="Attempts of one batch before the service stops.")
    retry_backoff_s: DurationS = Field(1.0, description="First delay between sink attempts; doubles.")


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: JSON unless standard error is a terminal."
    )


UNTIL_GRAMMAR = (
    "caught-up, an ISO-8601 UTC time such as 2026-01-31T12:00:00Z, or a duration ago with its unit "
    "such as 90s, 15m, 2h, 7d"
)
CAUGHT_UP = "caught-up"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: run.until's duration ago: its unit is required (a bare number is too easily a year or a date).
_UNTIL_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")


@dataclass(frozen=True, slots=True)
class Until:
    """Where a bounded run (``efo run --until``) ends: every shard caught up, or a moment in time."""

    time: datetime | None = None  # None: caught up

    @property
    def caught_up(self) -> bool:
        return self.time is None

    @property
    def time_ms(self) -> int | None:
        """The bound in whole milliseconds (arrival times' unit), rounded up: a record at 12:00:00.000
        is before 12:00:00.0005. Exact (integer microseconds, no float rounding)."""
        if self.time is None:
            return None
        micros = (self.time - _EPOCH) // timedelta(microseconds=1)
        return -(-micros // 1000)

    @classmethod
    def parse(cls, text: str, now: datetime | None = None) -> Until:
        """``caught-up``; an ISO-8601 time (UTC unless it names its offset), not in the future; or a
        duration ago (``2h``), resolved against ``now``: the run's bound is that fixed moment."""
        value = text.strip()
        now = now or datetime.now(UTC)
        if value.lower() in (CAUGHT_UP, "caught_up", "caughtup"):
            return cls()
        try:  # a time first: "20260131" is a date (ISO-8601 basic), never seconds ago
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            match = _UNTIL_DURATION.fullmatch(value.lower())
            if match is None or float(match.group(1)) <= 0:
                unitless = re.fullmatch(r"[+-]?\d+(?:\.\d+)?", value) is not None
                raise ValueError(
                    ("a number needs its unit (s, m, h or d), " if unitless else "")
                    + f"allowed: {UNTIL_GRAMMAR} (efo run --until, or run.until)"
                ) from None
            return cls(now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)]))
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        stamp = stamp.astimezone(UTC)
        if stamp > now:
            raise ValueError(
                f"{stamp.isoformat()} is in the future (now {now.isoformat(timespec='seconds')}): a bounded "
                "run ends at a moment already past; for a run that keeps reading, leave run.until unset"
            )
        return cls(stamp)

    def __str__(self) -> str:
        return CAUGHT_UP if self.time is None else self.time.isoformat()


class RunSettings(_Section):
    until: str | None = Field(
        None,
        description=f"Bounded run (efo run --until): stop once {UNTIL_GRAMMAR} is reached on every shard, "
        "then checkpoint, release and exit 0. Unset: run until SIGTERM.",
    )
    shard_timeout_s: PositiveDurationS = Field(
        300.0,
        description="Bounded run: a shard not at its bound that receives no event for this long "
        "(never answers) ends the run with exit 1.",
    )
    progress_interval_s: PositiveDurationS = Field(
        10.0, description="Bounded run: how often the run.progress log event is written."
    )
    max_duration_s: PositiveDurationS = Field(
        86400.0,
        description="Bounded run: stop after this long even if not at the end (e.g. a shard written faster "
        "than the sink commits, or the lease table unreadable): the sink commits what was handed on, "
        "checkpoints are written, leases released, exit 75 (run it again to go on).",
    )

    @field_validator("until")
    @classmethod
    def _until(cls, value: str | None) -> str | None:
        if value is None or not str(value).strip():
            return None
        return str(Until.parse(str(value)))

    @property
    def bound(self) -> Until | None:
        """The run's end, None for a run without one."""
        return None if self.until is None else Until.parse(self.until)


class SparkSettings(_Section):
    master: str = Field("local[2]", description="Spark master for the embedded session.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings (YAML map).")


#: What one entry of ``streams`` may set for its stream alone; the rest comes from the top level.
STREAM_ENTRY_KEYS: Final = ("stream", "initial_position", "skip_older_than", "consumer_name", "consumer_arn")
_STREAM_ARN = re.compile(r"arn:[^:]+:kinesis:[^:]*:[^:]*:stream/(?P<name>[^/]+)")


def stream_name(name_or_arn: str) -> str:
    """The stream's name, from its name or its ARN."""
    match = _STREAM_ARN.fullmatch(name_or_arn.strip())
    return match.group("name") if match else name_or_arn.strip()


class StreamEntry(BaseModel):
    """One stream of ``streams``: a name or ARN, and what it sets for itself alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: str
    initial_position: str | None = None
    skip_older_than: str | None = None
    consumer_name: str | None = None
    consumer_arn: str | None = None

    @property
    def name(self) -> str:
        return stream_name(self.stream)

    def given(self) -> dict[str, str]:
        """The settings this entry sets, by name (``stream`` included)."""
        return {key: value for key in STREAM_ENTRY_KEYS if (value := getattr(self, key)) is not None}


def _stream_entries(value: object) -> list[StreamEntry]:
    """``streams`` as entries: a comma-separated string (the environment's form), or a list of
    names, ARNs and mappings (YAML); every mistake named with its place in the list."""
    if isinstance(value, str):
        raw: list[object] = [part.strip() for part in value.split(",")] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        raw = list(value)
    else:
        raise ValueError("allowed: a list of stream names or ARNs, or of mappings with 'stream'")
    if not raw:
        raise ValueError("names no stream: name at least one, or set stream (EFO_STREAM) instead")
    entries = []
    for number, item in enumerate(raw, 1):
        where = f"entry {number}"
        if isinstance(item, StreamEntry):
            entries.append(item)
            continue
        if isinstance(item, str):
            item = {"stream": item}
        if not isinstance(item, dict):
            raise ValueError(f"{where} is {item!r}: allowed: a stream name or ARN, or a mapping with 'stream'")
        unknown = sorted(set(item) - set(STREAM_ENTRY_KEYS))
        if unknown:
            near = [f"{key!r}" for key in (nearest(str(name), STREAM_ENTRY_KEYS) for name in unknown) if key]
            also = f"; did you mean {', '.join(near)}?" if near else ""
            raise ValueError(
                f"{where} has {', '.join(map(repr, unknown))}: allowed keys: {', '.join(STREAM_ENTRY_KEYS)}{also}"
            )
        name = item.get("stream")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where} is empty: each entry names a stream (a name or an ARN)")
        for key, setting in item.items():
            if setting is not None and not isinstance(setting, str):
                raise ValueError(f"{where}: {key} = {setting!r}: allowed: a string")
        for key, parse in (("initial_position", InitialPosition.parse), ("skip_older_than", parse_duration_s)):
            if item.get(key) is None:
                continue
            try:
                parsed = parse(item[key])
            except ValueError as exc:
                raise ValueError(f"{where}: {key} = {item[key]!r}: {exc}") from None
            item[key] = f"{parsed:g}s" if isinstance(parsed, float) else str(parsed)
        consumer_arn = item.get("consumer_arn")
        if consumer_arn is not None and not consumer_arn.startswith("arn:"):
            raise ValueError(f"{where}: consumer_arn = {consumer_arn!r}: allowed: a consumer ARN")
        if consumer_arn is not None and item.get("consumer_name") is not None:
            raise ValueError(f"{where}: set consumer_name or consumer_arn, not both")
        entries.append(StreamEntry(**{**item, "stream": name.strip()}))
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.name in seen:
            raise ValueError(
                f"names stream {entry.name!r} twice ({seen[entry.name]!r} and {entry.stream!r}): list each stream once"
            )
        seen[entry.name] = entry.stream
    arns = [entry.consumer_arn for entry in entries if entry.consumer_arn]
    if len(arns) != len(set(arns)):
        raise ValueError("one consumer_arn is given for several streams: a consumer belongs to one stream")
    return entries


#: An AWS region's name: partition prefix, then words, then a number (eu-west-1, us-gov-west-1, us-isob-east-1).
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
#: Stands for ``stream`` when neither it nor ``streams`` is set: validation reports it missing.
_NO_STREAM: Final = "\0no stream"
#: Command-line flags of the ``load_settings`` call being validated: they win over the environment.
_FLAGS: ContextVar[Mapping[str, Any] | None] = ContextVar("efo_setting_flags", default=None)
#: False while a ``load_settings(environment=False)`` call is validated: EFO_* variables are not read.
_READ_ENVIRONMENT: ContextVar[bool] = ContextVar("efo_setting_environment", default=True)


class Settings(BaseSettings):
    """Everything ``efo run`` needs. Field descriptions are the README's configuration table."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    stream: str | None = Field(
        None, description="Stream name or ARN (required, unless `streams` lists several streams)."
    )
    streams: Annotated[list[StreamEntry] | None, NoDecode] = Field(
        None,
        description="Several streams in one application, instead of `stream`: names or ARNs, comma-separated "
        "in the environment; in YAML also mappings of `stream` and any of `initial_position`, "
        "`skip_older_than`, `consumer_name`, `consumer_arn`, which apply to that stream alone.",
    )
    app: str = Field(description="Application name (required); also the table and consumer name unless set.")
    table: str | None = Field(None, description="DynamoDB lease and checkpoint table. Default: app.")
    consumer_name: str | None = Field(None, description="EFO consumer to find or register. Default: app.")
    consumer_arn: str | None = Field(None, description="Use this registered consumer (not with consumer_name).")
    initial_position: str = Field(
        "LATEST",
        description="LATEST, TRIM_HORIZON or AT_TIMESTAMP:<ISO-8601>; applies only at the first start.",
    )
    sink: str = Field(description=f"Where batches go (required): {SINK_GRAMMAR}.")
    region: str | None = Field(
        None, description="AWS region. Default: the AWS SDK's (AWS_DEFAULT_REGION, or the AWS profile's)."
    )
    kinesis_endpoint: str | None = Field(None, description="Kinesis endpoint URL (local stack, VPC endpoint).")
    dynamodb_endpoint: str | None = Field(None, description="DynamoDB endpoint URL.")
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This worker's name in the lease table. Default: host name + pid.",
    )
    parquet_partition_by: str = Field(
        "",
        description="Comma-separated partition columns of the Parquet sink before efo_batch_id: "
        "arrival_date, arrival_hour (UTC, derived), stream, shard_id.",
    )
    on_corrupt_aggregate: Literal["passthrough", "dead_letter", "fail"] = Field(
        "passthrough",
        description="A KPL aggregate that does not decode: passthrough (raw record, error=corrupt_aggregate), "
        "dead_letter (to dead_letter_sink) or fail (stop).",
    )
    dead_letter_sink: str | None = Field(
        None, description=f"Where corrupt aggregates go with on_corrupt_aggregate=dead_letter: {SINK_GRAMMAR}."
    )
    value_format: Literal["binary", "utf8", "json"] = Field(
        "binary",
        description="Decode `data` into added columns: utf8 adds `value`; json adds the EFO_JSON_SCHEMA columns.",
    )
    json_schema: str | None = Field(
        None, description="Spark DDL of the JSON payload, e.g. `id BIGINT, name STRING` (with value_format=json)."
    )
    spark_remote: str | None = Field(
        None, description="Spark Connect URL (sc://host:port): run the batches on a Spark cluster, not a local JVM."
    )
    metrics_port: int = Field(0, ge=0, le=65535, description="Serve Prometheus /metrics on this port (0: off).")
    shutdown_timeout_s: PositiveDurationS = Field(
        30.0, description="SIGTERM: time to finish and checkpoint the running batch."
    )
    skip_older_than: str | None = Field(
        None,
        description="Only live data: a shard whose checkpoint is older than this (e.g. 60, 90s, 15m, 2h) "
        "starts at AT_TIMESTAMP(now - it) instead. Off by default.",
    )
    pool: PoolSettings = Field(default_factory=PoolSettings)  # type: ignore[arg-type]
    batch: BatchSettings = Field(default_factory=BatchSettings)  # type: ignore[arg-type]
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)  # type: ignore[arg-type]
    lease: LeaseSettings = Field(default_factory=LeaseSettings)  # type: ignore[arg-type]
    subscription: SubscriptionSettings = Field(default_factory=SubscriptionSettings)  # type: ignore[arg-type]
    shards: ShardSettings = Field(default_factory=ShardSettings)  # type: ignore[arg-type]
    sink_retry: SinkSettings = Field(default_factory=SinkSettings)  # type: ignore[arg-type]
    log: LogSettings = Field(default_factory=LogSettings)  # type: ignore[arg-type]
    spark: SparkSettings = Field(default_factory=SparkSettings)  # type: ignore[arg-type]
    run: RunSettings = Field(default_factory=RunSettings)  # type: ignore[arg-type]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init arguments; the environment wins over it; flags win over both.
        flags = InitSettingsSource(settings_cls, dict(_FLAGS.get() or {}))
        return (flags, env_settings, init_settings) if _READ_ENVIRONMENT.get() else (flags, init_settings)

    @field_validator("stream", "app")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value == _NO_STREAM:
            raise PydanticCustomError("missing", "Field required")
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @field_validator("streams", mode="before")
    @classmethod
    def _streams(cls, value: object) -> list[StreamEntry] | None:
        return None if value is None else _stream_entries(value)

    @model_validator(mode="before")
    @classmethod
    def _a_stream_is_required(cls, data: Any) -> Any:
        """Neither ``stream`` nor ``streams``: reported as ``stream`` missing, beside any other error."""
        if isinstance(data, dict) and data.get("stream") is None and data.get("streams") is None:
            return {**data, "stream": _NO_STREAM}
        return data

    @model_validator(mode="after")
    def _one_stream_form(self) -> Settings:
        if self.stream is not None and self.streams is not None:
            raise ValueError(
                f"stream (EFO_STREAM) = {self.stream!r} and streams (EFO_STREAMS) = "
                f"{','.join(entry.stream for entry in self.streams)!r}: set one of them, not both"
            )
        if self.streams is not None and len(self.streams) > 1 and self.consumer_arn:
            raise ValueError(
                f"consumer_arn (EFO_CONSUMER_ARN) = {self.consumer_arn!r} with {len(self.streams)} streams: a "
                "consumer belongs to one stream; give each entry of streams its own consumer_arn, or use consumer_name"
            )
        return self

    @field_validator("initial_position")
    @classmethod
    def _initial_position(cls, value: str) -> str:
        return str(InitialPosition.parse(value))

    @field_validator("skip_older_than")
    @classmethod
    def _skip_older_than(cls, value: str | None) -> str | None:
        if value is None or not str(value).strip():
            return None
        seconds = parse_duration_s(str(value))
        return f"{seconds:g}s"

    @field_validator("sink")
    @classmethod
    def _sink(cls, value: str) -> str:
        return str(SinkSpec.parse(value))

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.fullmatch(value):
            raise ValueError("allowed: an AWS region such as eu-west-1, us-east-1 or us-gov-west-1")
        return value

    @field_validator("kinesis_endpoint", "dynamodb_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/]+(/.*)?", value):
            raise ValueError("allowed: an http:// or https:// URL")
        return value

    @field_validator("spark_remote")
    @classmethod
    def _spark_remote(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError("allowed: a Spark Connect URL such as sc://spark-connect:15002")
        return value

    @field_validator("dead_letter_sink")
    @classmethod
    def _dead_letter_sink(cls, value: str | None) -> str | None:
        return None if value is None else str(SinkSpec.parse(value))

    @model_validator(mode="after")
    def _dead_letters_need_a_sink(self) -> Settings:
        if self.on_corrupt_aggregate == "dead_letter" and not self.dead_letter_sink:
            raise ValueError(
                "on_corrupt_aggregate (EFO_ON_CORRUPT_AGGREGATE) = 'dead_letter' needs dead_letter_sink "
                f"(EFO_DEAD_LETTER_SINK): {SINK_GRAMMAR}"
            )
        return self

    @model_validator(mode="after")
    def _arrow_sinks_start_no_spark(self) -> Settings:
        if self.sink_spec.declared.needs_spark:
            return self
        if self.value_format != "binary":
            raise ValueError(
                f"value_format (EFO_VALUE_FORMAT) = {self.value_format!r} decodes with Spark, which the sink "
                f"(EFO_SINK) = {self.sink!r} does not start: use value_format binary, or a parquet/handler sink"
            )
        if self.dead_letter_sink and SinkSpec.parse(self.dead_letter_sink).declared.needs_spark:
            raise ValueError(
                f"dead_letter_sink (EFO_DEAD_LETTER_SINK) = {self.dead_letter_sink!r} needs Spark, which the sink "
                f"(EFO_SINK) = {self.sink!r} does not start: use an arrow:<module>:<function> dead-letter sink"
            )
        return self

    @model_validator(mode="after")
    def _json_needs_schema(self) -> Settings:
        if self.value_format == "json" and not (self.json_schema and self.json_schema.strip()):
            raise ValueError(
                "value_format (EFO_VALUE_FORMAT) = 'json' needs json_schema (EFO_JSON_SCHEMA), a Spark DDL string"
            )
        return self

    @model_validator(mode="after")
    def _consumer_choice(self) -> Settings:
        if self.consumer_name and self.consumer_arn:
            raise ValueError(
                f"consumer_name (EFO_CONSUMER_NAME) = {self.consumer_name!r} and consumer_arn (EFO_CONSUMER_ARN) = "
                f"{self.consumer_arn!r}: set one of them, not both"
            )
        if self.consumer_arn and not self.consumer_arn.startswith("arn:"):
            raise ValueError(f"consumer_arn (EFO_CONSUMER_ARN) = {self.consumer_arn!r}: allowed: a consumer ARN")
        return self

    @model_validator(mode="after")
    def _until_agrees(self) -> Settings:
        """A bounded run whose window is empty by its own settings is a mistake, not a quick exit."""
        for each in self.per_stream():
            try:
                each._check_until()
            except ValueError as exc:
                raise ValueError(f"stream {each.stream!r}: {exc}" if self.streams else str(exc)) from None
        return self

    def _check_until(self) -> None:
        bound = self.run.bound
        if bound is None or bound.time is None:
            return
        until = f"run.until (EFO_RUN__UNTIL) = {self.run.until!r}"
        start = self.start
        if start.timestamp is not None and start.timestamp >= bound.time:
            raise ValueError(
                f"{until} is not after initial_position (EFO_INITIAL_POSITION) = {self.initial_position!r}: "
                "the replay window [initial_position, until) is empty; initial_position applies only at an "
                "application's first start: if this one has run before (it reads on from its checkpoints), "
                "remove initial_position; otherwise set until after it"
            )
        skip_s = self.skip_older_than_s
        if skip_s is not None and datetime.now(UTC) - timedelta(seconds=skip_s) >= bound.time:
            raise ValueError(
                f"{until} is older than skip_older_than (EFO_SKIP_OLDER_THAN) = {self.skip_older_than!r} "
                "ago: every record before it would be skipped; unset one of them"
            )

    def per_stream(self) -> list[Settings]:
        """The settings of each stream read (one for ``stream``): ``stream`` set, the entry's own
        settings over the top level's, ``streams`` unset."""
        if self.streams is None:
            return [self]
        # An entry's consumer_name replaces the top level's consumer_arn (never both in one stream).
        return [
            self.model_copy(
                update={**({"consumer_arn": None} if entry.consumer_name else {}), **entry.given(), "streams": None}
            )
            for entry in self.streams
        ]

    @property
    def stream_names(self) -> list[str]:
        """The name of each stream read, in the configured order."""
        return [stream_name(each.stream or "") for each in self.per_stream()]

    @property
    def stream_ref(self) -> str:
        """The one stream of these settings (name or ARN); several streams: see :meth:`per_stream`."""
        assert self.stream is not None, "settings of several streams: use per_stream()"
        return self.stream

    @property
    def skip_older_than_s(self) -> float | None:
        return parse_duration_s(self.skip_older_than) if self.skip_older_than else None

    @property
    def table_name(self) -> str:
        return self.table or self.app

    @property
    def consumer(self) -> str:
        return self.consumer_name or self.app

    @property
    def start(self) -> InitialPosition:
        return InitialPosition.parse(self.initial_position)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in self.parquet_partition_by.split(",") if c.strip())

    @property
    def sink_spec(self) -> SinkSpec:
        return SinkSpec.parse(self.sink)


def _env_name(location: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + NESTED_DELIMITER.join(str(part).upper() for part in location)


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        location = tuple(part for part in item["loc"] if part != "__root__")
        field = ".".join(str(part) for part in location) or "configuration"
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "missing":
            also = ", or streams (EFO_STREAMS) for several streams" if location == ("stream",) else ""
            lines.append(f"{field} ({_env_name(location)}) is required{also}")
        elif item["type"] == "extra_forbidden":
            near = _nearest_setting(location)
            also = f"; did you mean {'.'.join(near)} ({_env_name(near)})?" if near else ""
            lines.append(f"{field} ({_env_name(location)}) is not a setting{also}")
        elif item["type"] == "value_error" and isinstance(item.get("input"), dict):
            lines.append(message)  # a whole-section check: its message names the fields and values
        elif location:
            value = item.get("input")
            lines.append(f"{field} ({_env_name(location)}) = {value!r}: {message}")
        else:
            lines.append(message)
    return "invalid configuration: " + "; ".join(lines)


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``name`` most likely misspells, if one is close enough to say so."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _nearest_setting(location: tuple[int | str, ...]) -> tuple[str, ...] | None:
    """The setting beside ``location`` (in the same section) that its last part most likely misspells."""
    model: type[BaseModel] = Settings
    for part in location[:-1]:
        field = model.model_fields.get(str(part))
        section = field.annotation if field is not None else None
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            return None
        model = section
    near = nearest(str(location[-1]).lower(), model.model_fields)
    return None if near is None else (*(str(part) for part in location[:-1]), near)


#: EFO_* variables that belong to the tooling, not to the service's settings.
NON_SETTINGS = ("EFO_DEVSTACK_DIR", "EFO_DEV_STATE_DIR", "EFO_SELFTEST_", "EFO_TEST_", "EFO_LONG_TESTS", "EFO_CHAOS_")


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """EFO_* variables that name no setting: a typo there would otherwise be silently ignored."""
    known = {name.upper() for name in Settings.model_fields}
    unknown = []
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper.startswith(NON_SETTINGS):
            continue
        top = upper.removeprefix(ENV_PREFIX).split(NESTED_DELIMITER, 1)[0]
        if top not in known:
            unknown.append(name)
    return sorted(unknown)


def _unknown_variable(name: str) -> str:
    """``EFO_STRAEM is not a setting; did you mean EFO_STREAM?``"""
    top = name.upper().removeprefix(ENV_PREFIX).split(NESTED_DELIMITER, 1)[0]
    near = nearest(top, [known.upper() for known in Settings.model_fields])
    also = f"did you mean {ENV_PREFIX}{near}?" if near else "see 'efo config table' for the names"
    return f"{name} is not a setting; {also}"


def read_config_file(config_file: str | Path) -> dict[str, Any]:
    """The settings of a YAML file, or a ConfigError naming the file and what is wrong with it."""
    path = Path(config_file)
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"the configuration file {path} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"the configuration file {path} must hold a mapping of settings")
    return dict(loaded or {})


def load_settings(
    config_file: str | Path | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    flags: Mapping[str, Any] | None = None,
    environment: bool = True,
    **overrides: Any,
) -> Settings:
    """Read the YAML file (if any) and the environment; raise ConfigError naming every bad field.

    ``defaults`` apply only where neither the file nor the environment sets a value; ``overrides``
    win over the file (the environment still wins over both); ``flags`` (the command line's
    ``--stream``, ``--app``) win over everything. ``environment=False``: EFO_* variables are not
    read (a simulated worker's settings are its run's alone)."""
    values: dict[str, Any] = dict(defaults or {})
    if config_file is not None:
        values.update(read_config_file(config_file))
    values.update(overrides)
    unknown = unknown_environment(os.environ) if environment else []
    if unknown:
        raise ConfigError("invalid configuration: " + "; ".join(_unknown_variable(name) for name in unknown))
    token = _FLAGS.set({name: value for name, value in (flags or {}).items() if value is not None})
    reading = _READ_ENVIRONMENT.set(environment)
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    finally:
        _READ_ENVIRONMENT.reset(reading)
        _FLAGS.reset(token)


def setting_locations(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every setting as its path of field names (``("pool", "max_pending_records")``), in order."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from setting_locations(annotation, (*prefix, name))
        else:
            yield (*prefix, name)


def _field(location: tuple[str, ...]) -> FieldInfo:
    model: Any = Settings
    for name in location[:-1]:
        model = model.model_fields[name].annotation
    return model.model_fields[location[-1]]  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class SettingSource:
    """Where a setting's effective value came from: ``kind`` is default, file, environment or flag
    (or missing: a required setting not set, in ``efo config show``); ``origin`` names the file, the
    variable or the flag (for a default, what it was taken from, if anything)."""

    kind: Literal["default", "file", "environment", "flag", "missing"]
    origin: str = ""


_ABSENT = object()


def setting_sources(
    config_file: str | Path | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, SettingSource]:
    """Where each setting's value comes from, by dotted name, with the precedence of
    :func:`load_settings`: a flag, else the environment, else the file, else the default. A
    section given whole (``EFO_POOL='{...}'`` or a YAML mapping) is the source of its fields."""
    file_values = read_config_file(config_file) if config_file is not None else {}
    upper_environ = {name.upper(): name for name in environ}
    sources: dict[str, SettingSource] = {}
    for location in setting_locations():
        dotted = ".".join(location)
        variables = [_env_name(location[:depth]) for depth in range(len(location), 0, -1)]
        in_file: Any = file_values
        for name in location:
            in_file = in_file.get(name, _ABSENT) if isinstance(in_file, dict) else _ABSENT
        in_flags: Any = flags or {}
        for name in location:
            in_flags = in_flags.get(name) if isinstance(in_flags, Mapping) else None
        if in_flags is not None:
            sources[dotted] = SettingSource("flag", "--" + location[-1].replace("_", "-"))
        elif found := next((upper_environ[v] for v in variables if v in upper_environ), None):
            sources[dotted] = SettingSource("environment", found)
        elif in_file is not _ABSENT:
            sources[dotted] = SettingSource("file", str(config_file))
        else:
            sources[dotted] = SettingSource("default")
    return sources


REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|key|\bsas\b|signature", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?<=://)([^/@:]*):[^/@]*@")
_URL_TOKEN = re.compile(r"(;\s*token=)[^;]*", re.IGNORECASE)


def redacted(location: tuple[str, ...], value: Any) -> Any:
    """A setting's value fit to print: secrets in URLs (a password, a Spark Connect ``token``), in
    Spark settings (``spark.conf`` keys naming a key, token, secret, password or credential) and in
    any setting so named are replaced by ``<redacted>``."""
    if value is None:
        return None
    if _SECRET_NAME.search(location[-1]):
        return REDACTED
    if isinstance(value, dict):
        return {key: REDACTED if _SECRET_NAME.search(key) else item for key, item in value.items()}
    if isinstance(value, str):
        return _URL_TOKEN.sub(r"\1" + REDACTED, _URL_PASSWORD.sub(r"\1:" + REDACTED + "@", value))
    return value


def settings_table() -> str:
    """The README's configuration table, generated from the field definitions above."""
    rows = ["| setting | environment | default | meaning |", "|---|---|---|---|"]
    for location in setting_locations():
        field = _field(location)
        name = location[-1]
        if field.is_required():
            default = "required"
        elif location == ("stream",):
            default = "required, or `streams`"
        elif field.default_factory is not None:
            default = "host-pid" if name == "worker_id" else f"`{field.default_factory()!r}`"  # type: ignore[call-arg]
        elif field.default is None:
            default = ""
        else:
            default = f"`{field.default}`"
        rows.append(f"| `{'.'.join(location)}` | `{_env_name(location)}` | {default} | {field.description or ''} |")
    return "\n".join(rows)
