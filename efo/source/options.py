"""The source's options: ``spark.readStream.format("efo").option(name, value)``.

Every option is declared once in :data:`OPTIONS` (its name, its default, what it means and how it is
read); :func:`parse` checks them all at ``load()``, and the README's table is :func:`options_table`
(a test keeps the two equal). Spark hands a Python source its options with lower-cased names, so a
name is matched whatever its case; one that names no option, or a value that does not parse, is a
:class:`~efo.errors.ConfigError` naming the option, the value and what is allowed.

Credentials are never options (an option ends up in the query's plan and its logs): the source
uses the AWS SDK's own chain (environment, profile, web identity, instance role).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from efo.config import InitialPosition, parse_duration_s, stream_name
from efo.errors import ConfigError

#: The name the source is found by: ``spark.readStream.format("efo")``.
FORMAT = "efo"

CorruptPolicy = Literal["passthrough", "fail"]


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The options of one query's source, parsed and checked."""

    streams: tuple[str, ...]
    consumer_name: str | None = None
    consumer_arn: str | None = None
    region: str | None = None
    endpoint: str | None = None
    starting_position: InitialPosition = field(default_factory=lambda: InitialPosition("LATEST"))
    skip_older_than_s: float | None = None
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    on_corrupt_aggregate: CorruptPolicy = "passthrough"
    fail_on_data_loss: bool = True
    metrics_port: int = 0
    max_pending_records: int = 200_000
    max_pending_bytes: int = 256 * 1024 * 1024
    shard_timeout_s: float = 300.0
    shard_sync_interval_s: float = 10.0

    def stream_names(self) -> tuple[str, ...]:
        return tuple(stream_name(stream) for stream in self.streams)


def _streams(text: str) -> tuple[str, ...]:
    entries = tuple(entry.strip() for entry in text.split(","))
    if not entries or any(not entry for entry in entries):
        raise ValueError("allowed: one or more stream names or ARNs, comma-separated, none empty")
    names = [stream_name(entry) for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"stream {twice[0]!r} is listed twice; allowed: each stream once (by name or ARN)")
    return entries


def _positive_int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError("allowed: a whole number above 0")
    return value


def _port(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise ValueError("allowed: a port number from 1 to 65535, or 0 for none")
    return value


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("allowed: true or false")
    return value == "true"


def _corrupt_policy(text: str) -> CorruptPolicy:
    value = text.strip().lower()
    if value == "passthrough":
        return "passthrough"
    if value == "fail":
        return "fail"
    raise ValueError("allowed: passthrough or fail")


def _consumer_arn(text: str) -> str:
    value = text.strip()
    if not re.fullmatch(r"arn:[^:]+:kinesis:[^:]*:[^:]*:stream/[^/]+/consumer/[^:/]+:\d+", value):
        raise ValueError(
            "allowed: a stream consumer's ARN (arn:aws:kinesis:<region>:<account>:stream/<s>/consumer/<c>:<n>)"
        )
    return value


def _consumer_name(text: str) -> str:
    value = text.strip()
    if not re.fullmatch(r"[a-zA-Z0-9_.-]{1,128}", value):
        raise ValueError("allowed: 1 to 128 letters, digits, '_', '.' or '-'")
    return value


def _endpoint(text: str) -> str:
    value = text.strip()
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise ValueError("allowed: an http:// or https:// URL")
    return value


def _region(text: str) -> str:
    value = text.strip()
    if not re.fullmatch(r"[a-z]{2}(-[a-z0-9]+)+-\d+", value):
        raise ValueError("allowed: an AWS region such as eu-west-1")
    return value


def _position(text: str) -> InitialPosition:
    return InitialPosition.parse(text)


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # as documented; matched whatever its case
    field: str  # of SourceOptions
    read: Callable[[str], Any]
    default: str  # as the README shows it
    meaning: str


OPTIONS: tuple[Option, ...] = (
    Option(
        "streams",
        "streams",
        _streams,
        "required",
        "The stream, or several streams, to read: names or ARNs, comma-separated. The `stream` column names each "
        "row's stream.",
    ),
    Option(
        "consumerName",
        "consumer_name",
        _consumer_name,
        "required, or `consumerArn`",
        "The Enhanced Fan-Out consumer to read through, on every stream: found, or registered and waited for until "
        "ACTIVE (as `efo run` does). Never deregistered by the source. Two queries on one stream need two consumers.",
    ),
    Option(
        "consumerArn",
        "consumer_arn",
        _consumer_arn,
        "",
        "Read through this registered consumer instead (one stream only; not with `consumerName`).",
    ),
    Option("region", "region", _region, "the AWS SDK's", "AWS region of the streams."),
    Option(
        "endpoint", "endpoint", _endpoint, "", "Kinesis endpoint URL (a VPC endpoint, the local stack); default: AWS's."
    ),
    Option(
        "startingPosition",
        "starting_position",
        _position,
        "`LATEST`",
        "Where the query's first start reads each shard: LATEST, TRIM_HORIZON or AT_TIMESTAMP:<ISO-8601>. A restart "
        "reads on from Spark's checkpoint; shards born later (splits, merges) are read from their start whatever this "
        "says. LATEST is the moment of the query's first batch, kept in that batch's offsets.",
    ),
    Option(
        "skipOlderThan",
        "skip_older_than_s",
        parse_duration_s,
        "",
        "Only live data: when the query starts (or restarts), a shard whose next record would be older than this "
        "(e.g. 90s, 15m, 2h) starts at AT_TIMESTAMP(now - it) instead; what is skipped is logged and counted. Off by "
        "default.",
    ),
    Option(
        "maxRecordsPerTrigger",
        "max_records_per_trigger",
        _positive_int,
        "",
        "At most this many rows in a micro-batch (Spark's `ReadMaxRows`); a KPL aggregate may be split across two "
        "batches. Default: what has been read, up to the pool.",
    ),
    Option(
        "maxBytesPerTrigger",
        "max_bytes_per_trigger",
        _positive_int,
        "",
        "At most this many bytes of `data` in a micro-batch (Spark's `ReadMaxBytes`; with maxRecordsPerTrigger as "
        "well, Spark is given the rows limit and the source keeps both); a single larger record makes a batch alone.",
    ),
    Option(
        "onCorruptAggregate",
        "on_corrupt_aggregate",
        _corrupt_policy,
        "`passthrough`",
        "A KPL aggregate that does not decode: passthrough (one row with the raw record, `error` = "
        "corrupt_aggregate) or fail (the query stops, naming the shard).",
    ),
    Option(
        "failOnDataLoss",
        "fail_on_data_loss",
        _bool,
        "`true`",
        "Records the query should read that Kinesis no longer has (past the stream's retention, a shard gone, the "
        "stream deleted and recreated): true fails the query naming the stream and shard; false logs, counts and "
        "reads on from the oldest record left.",
    ),
    Option(
        "metricsPort",
        "metrics_port",
        _port,
        "`0`",
        "Serve efo's Prometheus /metrics of this query's subscriptions on this port of the driver (0: none). One "
        "port per query.",
    ),
    Option(
        "maxPendingRecords",
        "max_pending_records",
        _positive_int,
        "`200000`",
        "Records read ahead of Spark and held on the driver, at most (efo's pool): a full pool stops reading.",
    ),
    Option(
        "maxPendingBytes",
        "max_pending_bytes",
        _positive_int,
        "`268435456`",
        "Bytes of record data read ahead and held on the driver, at most.",
    ),
    Option(
        "shardTimeout",
        "shard_timeout_s",
        parse_duration_s,
        "`300s`",
        "A shard the query is waiting for (Trigger.AvailableNow, or a batch read again after a restart) that gives "
        "nothing for this long fails the query, naming it.",
    ),
    Option(
        "shardSyncInterval",
        "shard_sync_interval_s",
        parse_duration_s,
        "`10s`",
        "How often ListShards looks for shards born since (splits and merges).",
    ),
)

_BY_KEY = {option.name.lower(): option for option in OPTIONS}


def _error(name: str, value: str, allowed: str) -> ConfigError:
    return ConfigError(f"efo source: option {name} = {value!r}: {allowed}")


def parse(options: Mapping[str, str]) -> SourceOptions:
    """The options Spark handed the source, checked: a :class:`ConfigError` names the first bad one."""
    values: dict[str, Any] = {}
    for key, raw in options.items():
        option = _BY_KEY.get(key.lower())
        if option is None:
            known = ", ".join(o.name for o in OPTIONS)
            raise ConfigError(f"efo source: {key!r} is not an option of the efo source; allowed: {known}")
        try:
            values[option.field] = option.read(str(raw))
        except ValueError as exc:
            raise _error(option.name, str(raw), str(exc)) from None
    if "streams" not in values:
        raise ConfigError(
            "efo source: option streams is required: the stream name(s) or ARN(s) to read, "
            "e.g. .option('streams', 'orders')"
        )
    if ("consumer_name" in values) == ("consumer_arn" in values):
        raise ConfigError(
            "efo source: set exactly one of the options consumerName (found or registered on each stream) "
            "and consumerArn (one stream's registered consumer)"
        )
    if "consumer_arn" in values and len(values["streams"]) > 1:
        raise _error(
            "consumerArn",
            values["consumer_arn"],
            "a consumer ARN names one stream's consumer: with several streams set consumerName instead",
        )
    return SourceOptions(**values)


def options_table() -> str:
    """The README's table of the source's options, generated from :data:`OPTIONS`."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    rows.extend(f"| `{option.name}` | {option.default} | {option.meaning} |" for option in OPTIONS)
    return "\n".join(rows)


__all__ = ["FORMAT", "OPTIONS", "Option", "SourceOptions", "options_table", "parse"]
