"""Settings: EFO_ environment, nested ``__``, the YAML file, validation messages, the README table."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from efo.config import InitialPosition, SettingSource, load_settings, redacted, setting_sources, settings_table
from efo.errors import EXIT_CONFIG, ConfigError

README = Path(__file__).resolve().parents[2] / "README.md"
REQUIRED = {"EFO_STREAM": "orders", "EFO_APP": "orders-app", "EFO_SINK": "console"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No EFO_* variable of the developer's shell (in any case) leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _config_error(monkeypatch: pytest.MonkeyPatch, **values: str) -> str:
    _env(monkeypatch, **{**REQUIRED, **values})
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.exit_code == EXIT_CONFIG
    return str(info.value)


# ---- environment and file ---------------------------------------------------------------


def test_top_level_settings_are_read_from_efo_prefixed_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED, EFO_INITIAL_POSITION="TRIM_HORIZON", EFO_METRICS_PORT="9100")
    settings = load_settings()
    assert (settings.stream, settings.app, settings.sink) == ("orders", "orders-app", "console")
    assert settings.initial_position == "TRIM_HORIZON"
    assert settings.metrics_port == 9100


def test_nested_settings_use_a_double_underscore_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED, EFO_POOL__MAX_PENDING_BYTES="2048", EFO_BATCH__MAX_WAIT_S="0.25")
    settings = load_settings()
    assert settings.pool.max_pending_bytes == 2048
    assert settings.pool.max_pending_records == 200_000  # siblings keep their defaults
    assert settings.batch.max_wait_s == 0.25


def test_environment_variables_without_the_efo_prefix_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED, POOL__MAX_PENDING_BYTES="2048", STREAM="other")
    settings = load_settings()
    assert settings.pool.max_pending_bytes == 256 * 1024 * 1024
    assert settings.stream == "orders"


def test_yaml_file_supplies_settings_including_nested_sections(tmp_path: Path) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text(
        "stream: file-stream\napp: file-app\nsink: parquet:/tmp/out\n"
        "pool: {max_pending_records: 5, max_pending_bytes: 4096}\n"
    )
    settings = load_settings(path)
    assert (settings.stream, settings.app, settings.sink) == ("file-stream", "file-app", "parquet:/tmp/out")
    assert (settings.pool.max_pending_records, settings.pool.max_pending_bytes) == (5, 4096)


def test_environment_wins_over_the_yaml_file_field_by_field_even_inside_a_nested_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text(
        "stream: file-stream\napp: file-app\nsink: console\npool: {max_pending_records: 5, max_pending_bytes: 4096}\n"
    )
    _env(monkeypatch, EFO_APP="env-app", EFO_POOL__MAX_PENDING_BYTES="8192")
    settings = load_settings(path)
    assert settings.app == "env-app"
    assert settings.stream == "file-stream"
    assert settings.pool.max_pending_bytes == 8192
    assert settings.pool.max_pending_records == 5  # the file's value for the sibling survives


def test_unreadable_or_malformed_config_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_settings(missing)
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"list\.yaml must hold a mapping"):
        load_settings(not_a_mapping)


# ---- defaults ---------------------------------------------------------------------------


def test_table_and_consumer_names_default_to_the_app_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED)
    settings = load_settings()
    assert settings.table_name == "orders-app"
    assert settings.consumer == "orders-app"
    assert settings.initial_position == "LATEST"


def test_explicit_table_and_consumer_names_override_the_app_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED, EFO_TABLE="leases", EFO_CONSUMER_NAME="fanout")
    settings = load_settings()
    assert (settings.table_name, settings.consumer) == ("leases", "fanout")


# ---- validation messages ----------------------------------------------------------------


def test_bad_initial_position_names_field_env_variable_value_and_allowed_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = _config_error(monkeypatch, EFO_INITIAL_POSITION="EARLIEST")
    assert "initial_position" in message
    assert "EFO_INITIAL_POSITION" in message
    assert "'EARLIEST'" in message
    assert "LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>" in message


def test_sink_outside_the_grammar_names_field_env_variable_value_and_the_grammar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for bad in ("kafka:topic", "parquet:", "handler:no_function", "arrow:module", "console:extra"):
        message = _config_error(monkeypatch, EFO_SINK=bad)
        assert "sink (EFO_SINK)" in message
        assert repr(bad) in message
        assert "parquet:<path or URI>, handler:<module>:<function>, arrow:<module>:<function>, console" in message


def test_an_arrow_sink_starts_no_spark_so_spark_decoding_and_dataframe_dead_letters_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    message = _config_error(monkeypatch, EFO_SINK="arrow:my.module:write", EFO_VALUE_FORMAT="utf8")
    assert "value_format (EFO_VALUE_FORMAT) = 'utf8'" in message and "arrow:my.module:write" in message
    message = _config_error(
        monkeypatch,
        EFO_SINK="arrow:my.module:write",
        EFO_VALUE_FORMAT="binary",
        EFO_ON_CORRUPT_AGGREGATE="dead_letter",
        EFO_DEAD_LETTER_SINK="parquet:/tmp/dead",
    )
    assert "dead_letter_sink (EFO_DEAD_LETTER_SINK) = 'parquet:/tmp/dead'" in message


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ("EFO_BATCH__MAX_WAIT_S", "batch.max_wait_s"),
        ("EFO_SHUTDOWN_TIMEOUT_S", "shutdown_timeout_s"),
        ("EFO_CHECKPOINT__INTERVAL_S", "checkpoint.interval_s"),
        ("EFO_SUBSCRIPTION__BACKOFF_INITIAL_S", "subscription.backoff_initial_s"),
    ],
)
def test_negative_duration_names_field_env_variable_value_and_the_bound(
    monkeypatch: pytest.MonkeyPatch, env: str, field: str
) -> None:
    message = _config_error(monkeypatch, **{env: "-1.5"})
    assert f"{field} ({env})" in message
    assert "'-1.5'" in message
    assert "greater than 0" in message


def test_consumer_name_and_consumer_arn_together_are_rejected_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(
        monkeypatch, EFO_CONSUMER_NAME="fanout", EFO_CONSUMER_ARN="arn:aws:kinesis:eu-west-1:1:stream/s/consumer/c:1"
    )
    assert "consumer_name" in message
    assert "consumer_arn" in message
    assert "not both" in message


def test_consumer_name_and_consumer_arn_conflict_names_the_environment_variables_and_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arn = "arn:aws:kinesis:eu-west-1:1:stream/s/consumer/c:1"
    message = _config_error(monkeypatch, EFO_CONSUMER_NAME="fanout", EFO_CONSUMER_ARN=arn)
    assert "EFO_CONSUMER_NAME" in message
    assert "EFO_CONSUMER_ARN" in message
    assert "fanout" in message


def test_unknown_nested_key_is_rejected_naming_the_key_and_its_env_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(monkeypatch, EFO_POOL__NOPE="1")
    assert "pool.nope (EFO_POOL__NOPE) is not a setting" in message


def test_unknown_key_in_the_yaml_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text("stream: s\napp: a\nsink: console\nbatch: {max_recrods: 5}\n")
    with pytest.raises(ConfigError, match=r"batch\.max_recrods \(EFO_BATCH__MAX_RECRODS\) is not a setting"):
        load_settings(path)


def test_missing_stream_app_and_sink_are_all_reported_with_their_env_variables() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "stream (EFO_STREAM) is required" in message
    assert "app (EFO_APP) is required" in message
    assert "sink (EFO_SINK) is required" in message


def test_blank_stream_is_rejected_as_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(monkeypatch, EFO_STREAM="   ")
    assert "stream (EFO_STREAM)" in message
    assert "must not be empty" in message


# ---- AT_TIMESTAMP -----------------------------------------------------------------------


def test_at_timestamp_with_z_suffix_parses_as_utc() -> None:
    position = InitialPosition.parse("AT_TIMESTAMP:2026-01-31T12:00:00Z")
    assert position.kind == "AT_TIMESTAMP"
    assert position.timestamp == datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    assert position.timestamp is not None and position.timestamp.utcoffset() is not None


def test_at_timestamp_without_offset_is_taken_as_utc() -> None:
    position = InitialPosition.parse("AT_TIMESTAMP:2026-01-31T12:00:00")
    assert position.timestamp == datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    assert position.timestamp is not None and position.timestamp.tzinfo is not None


def test_at_timestamp_with_an_offset_is_converted_to_utc() -> None:
    position = InitialPosition.parse("at_timestamp:2026-01-31T14:30:00+02:00")
    assert position.timestamp == datetime(2026, 1, 31, 12, 30, tzinfo=UTC)
    assert position.timestamp is not None and position.timestamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


def test_at_timestamp_setting_is_normalised_and_exposed_as_start(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED, EFO_INITIAL_POSITION="AT_TIMESTAMP:2026-01-31T12:00:00Z")
    settings = load_settings()
    assert settings.initial_position == "AT_TIMESTAMP:2026-01-31T12:00:00+00:00"
    assert settings.start == InitialPosition("AT_TIMESTAMP", datetime(2026, 1, 31, 12, tzinfo=UTC))


def test_at_timestamp_that_is_not_iso_8601_names_the_value_and_an_example(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(monkeypatch, EFO_INITIAL_POSITION="AT_TIMESTAMP:yesterday")
    assert "initial_position (EFO_INITIAL_POSITION)" in message
    assert "'yesterday'" in message
    assert "2026-01-31T12:00:00Z" in message


# ---- README -----------------------------------------------------------------------------


def test_readme_configuration_table_is_the_generated_settings_table_verbatim() -> None:
    text = README.read_text()
    match = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert match is not None, "README.md lacks the settings-table markers"
    assert match.group(1) == settings_table()


def test_settings_table_lists_every_setting_with_its_env_variable_and_default() -> None:
    table = settings_table()
    assert "| `pool.max_pending_bytes` | `EFO_POOL__MAX_PENDING_BYTES` | `268435456` |" in table
    assert "| `stream` | `EFO_STREAM` | required, or `streams` |" in table
    assert "| `worker_id` | `EFO_WORKER_ID` | host-pid |" in table


def test_an_efo_variable_that_names_no_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(monkeypatch, EFO_BATCH_MAX_RECORDS="5")
    assert "EFO_BATCH_MAX_RECORDS is not a setting" in message


def test_tooling_variables_with_the_efo_prefix_are_not_settings_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("EFO_DEVSTACK_DIR", "/tmp/devstack")
    monkeypatch.setenv("EFO_TEST_SUBSCRIPTION_LIFETIME_S", "3")
    monkeypatch.setenv("EFO_DEV_STATE_DIR", "/tmp/efo-dev")  # efo dev's state, beside efo run in one shell
    # make chaos's own: tests marked long, the chaos scenarios' size and seed, and the benchmarks they run
    monkeypatch.setenv("EFO_LONG_TESTS", "1")
    monkeypatch.setenv("EFO_CHAOS_SIZE", "full")
    assert load_settings(stream="s", app="a", sink="console").app == "a"


# ---- flags, where each setting comes from, and what is never printed --------------------------------


def test_flags_win_over_the_environment_which_wins_over_the_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text("stream: from-file\napp: from-file\ntable: from-file\n")
    _env(clean_env, **REQUIRED)
    settings = load_settings(path, flags={"stream": "from-flag", "app": None})
    assert (settings.stream, settings.app, settings.table) == ("from-flag", "orders-app", "from-file")
    assert load_settings(path).stream == "orders"  # a flag applies to its own call only


def test_setting_sources_follow_the_precedence_and_name_the_variable_file_or_flag(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text("app: from-file\npool:\n  max_pending_bytes: 4096\nlog:\n  level: DEBUG\n")
    _env(clean_env, EFO_STREAM="s", efo_log__level="ERROR", EFO_BATCH='{"max_records": 5}')
    sources = setting_sources(path, flags={"stream": "from-flag", "app": None})
    assert sources["stream"] == SettingSource("flag", "--stream")
    assert sources["app"] == SettingSource("file", str(path))
    assert sources["pool.max_pending_bytes"] == SettingSource("file", str(path))
    assert sources["log.level"] == SettingSource("environment", "efo_log__level")  # as spelled, in any case
    assert sources["batch.max_records"] == SettingSource("environment", "EFO_BATCH")  # a whole section as JSON
    assert sources["pool.max_pending_records"] == SettingSource("default")
    assert len(sources) == settings_table().count("\n| `")


@pytest.mark.parametrize(
    ("location", "value", "shown"),
    [
        (("spark_remote",), "sc://host:15002/;token=abc;user_id=me", "sc://host:15002/;token=<redacted>;user_id=me"),
        (("kinesis_endpoint",), "https://user:pa55@vpce.example:443/", "https://user:<redacted>@vpce.example:443/"),
        (("kinesis_endpoint",), "http://127.0.0.1:4567", "http://127.0.0.1:4567"),
        (
            ("spark", "conf"),
            {"spark.hadoop.fs.s3a.access.key": "AKIA", "spark.ssl.keyPassword": "p", "spark.sql.x": "1"},
            {"spark.hadoop.fs.s3a.access.key": "<redacted>", "spark.ssl.keyPassword": "<redacted>", "spark.sql.x": "1"},
        ),
        (("api_token",), "t0k3n", "<redacted>"),
        (("pool", "max_pending_records"), 7, 7),
        (("table",), None, None),
    ],
)
def test_redacted_hides_passwords_tokens_and_keys_and_nothing_else(
    location: tuple[str, ...], value: object, shown: object
) -> None:
    assert redacted(location, value) == shown


def test_a_batch_of_2_gib_or_more_is_refused_naming_the_field_its_env_variable_and_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's data column is Arrow binary (32-bit offsets): 2 GiB of values cannot be one column."""
    message = _config_error(monkeypatch, EFO_BATCH__MAX_BYTES=str(2**31))
    assert "batch.max_bytes (EFO_BATCH__MAX_BYTES)" in message
    assert "less than or equal to 1073741824" in message
    _env(monkeypatch, EFO_BATCH__MAX_BYTES=str(2**30))
    assert load_settings().batch.max_bytes == 2**30


# ---- several streams --------------------------------------------------------------------


def _streams_error(monkeypatch: pytest.MonkeyPatch, **values: Any) -> str:
    _env(monkeypatch, EFO_APP="lake", EFO_SINK="console")
    with pytest.raises(ConfigError) as info:
        load_settings(**values)
    assert info.value.exit_code == EXIT_CONFIG
    return str(info.value)


def test_streams_from_the_environment_are_comma_separated_names_or_arns(monkeypatch: pytest.MonkeyPatch) -> None:
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/payments"
    _env(monkeypatch, EFO_APP="lake", EFO_SINK="console", EFO_STREAMS=f"orders, {arn}")
    settings = load_settings()
    assert settings.stream_names == ["orders", "payments"]
    assert [each.stream for each in settings.per_stream()] == ["orders", arn]
    assert all(each.streams is None for each in settings.per_stream())


def test_a_stream_entry_overrides_the_top_level_for_its_stream_alone(tmp_path: Path) -> None:
    path = tmp_path / "efo.yaml"
    path.write_text(
        "app: lake\nsink: console\ninitial_position: LATEST\nconsumer_name: shared\n"
        "streams:\n  - {stream: orders, initial_position: TRIM_HORIZON, skip_older_than: 2h}\n  - payments\n"
        "  - {stream: clicks, consumer_arn: 'arn:aws:kinesis:eu-west-1:1:stream/clicks/consumer/c:1'}\n"
    )
    orders, payments, clicks = load_settings(path).per_stream()
    assert (orders.stream, orders.initial_position, orders.skip_older_than_s) == ("orders", "TRIM_HORIZON", 7200)
    assert (payments.initial_position, payments.skip_older_than, payments.consumer) == ("LATEST", None, "shared")
    assert clicks.consumer_arn == "arn:aws:kinesis:eu-west-1:1:stream/clicks/consumer/c:1"


def test_one_stream_is_its_own_only_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **REQUIRED)
    settings = load_settings()
    assert settings.per_stream() == [settings] and settings.stream_names == ["orders"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"stream": "orders", "streams": "payments"}, "stream (EFO_STREAM) = 'orders' and streams (EFO_STREAMS) = "),
        ({"streams": "orders,"}, "streams (EFO_STREAMS) = 'orders,': entry 2 is empty"),
        ({"streams": ""}, "streams (EFO_STREAMS) = '': names no stream"),
        ({"streams": "orders,arn:aws:kinesis:eu-west-1:1:stream/orders"}, "names stream 'orders' twice"),
        ({"streams": [{"stream": "orders", "batch_size": "5"}]}, "entry 1 has 'batch_size': allowed keys: stream, "),
        ({"streams": [{"stream": "orders", "initial_position": "EARLIEST"}]}, "entry 1: initial_position = 'EARLIEST'"),
        ({"streams": [{"stream": "orders", "skip_older_than": "soon"}]}, "entry 1: skip_older_than = 'soon'"),
        (
            {"streams": "orders,payments", "consumer_arn": "arn:aws:kinesis:eu-west-1:1:stream/orders/consumer/c:1"},
            "with 2 streams: a consumer belongs to one stream",
        ),
        (
            {"streams": [{"stream": "a", "consumer_arn": "arn:x"}, {"stream": "b", "consumer_arn": "arn:x"}]},
            "one consumer_arn is given for several streams",
        ),
        ({}, "stream (EFO_STREAM) is required, or streams (EFO_STREAMS) for several streams"),
    ],
)
def test_a_bad_list_of_streams_is_refused_naming_the_field_and_the_value(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, Any], expected: str
) -> None:
    assert expected in _streams_error(monkeypatch, **values)


def test_a_bounded_run_checks_each_streams_own_initial_position(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _streams_error(
        monkeypatch,
        streams=[{"stream": "orders", "initial_position": "AT_TIMESTAMP:2026-01-02T00:00:00Z"}, "payments"],
        run={"until": "2026-01-01T00:00:00Z"},
    )
    assert "stream 'orders': run.until (EFO_RUN__UNTIL) = '2026-01-01T00:00:00+00:00' is not after" in message


# ---- durations with their unit, and the nearest setting for a misspelt one ------------------------


def _duration_locations() -> list[tuple[str, ...]]:
    from efo.config import setting_locations

    return [location for location in setting_locations() if location[-1].endswith("_s")]


def _env_of(location: tuple[str, ...]) -> str:
    return "EFO_" + "__".join(part.upper() for part in location)


def test_every_duration_setting_is_found_by_its_name() -> None:
    names = {".".join(location) for location in _duration_locations()}
    assert {"shutdown_timeout_s", "batch.max_wait_s", "lease.failover_s", "run.max_duration_s"} <= names
    assert len(names) >= 15


@pytest.mark.parametrize("location", _duration_locations(), ids=lambda location: ".".join(location))
@pytest.mark.parametrize(("text", "seconds"), [("5m", 300.0), ("90s", 90.0), ("2.5", 2.5), ("1h", 3600.0)])
def test_every_duration_setting_takes_a_number_of_seconds_or_a_unit(
    monkeypatch: pytest.MonkeyPatch, location: tuple[str, ...], text: str, seconds: float
) -> None:
    # lease.failover_s must stay at least three heartbeat intervals, whatever is set here.
    lease = {"EFO_LEASE__FAILOVER_S": "1d", "EFO_LEASE__HEARTBEAT_INTERVAL_S": "0.5"}
    _env(monkeypatch, **{**REQUIRED, **lease, _env_of(location): text})
    value: Any = load_settings()
    for name in location:
        value = getattr(value, name)
    assert value == seconds


def test_a_duration_in_the_yaml_file_takes_its_unit_too(tmp_path: Path) -> None:
    config = tmp_path / "efo.yaml"
    config.write_text("batch: {max_wait_s: 500ms}\n")
    with pytest.raises(ConfigError):
        load_settings(config, **{k.removeprefix("EFO_").lower(): v for k, v in REQUIRED.items()})
    config.write_text("batch: {max_wait_s: 2m}\nrun: {max_duration_s: 1d}\nshutdown_timeout_s: 45\n")
    settings = load_settings(config, **{k.removeprefix("EFO_").lower(): v for k, v in REQUIRED.items()})
    assert (settings.batch.max_wait_s, settings.run.max_duration_s, settings.shutdown_timeout_s) == (120, 86400, 45)


@pytest.mark.parametrize(
    "location", [*_duration_locations(), ("skip_older_than",)], ids=lambda location: ".".join(location)
)
def test_a_duration_that_does_not_parse_is_refused_the_same_way_for_every_setting(
    monkeypatch: pytest.MonkeyPatch, location: tuple[str, ...]
) -> None:
    from efo.config import DURATION_GRAMMAR

    env = _env_of(location)
    message = _config_error(monkeypatch, **{env: "soon"})
    bound = "at least 0" if location == ("sink_retry", "retry_backoff_s") else "greater than 0"
    assert f"{'.'.join(location)} ({env}) = 'soon': allowed: a duration {bound}: {DURATION_GRAMMAR}" in message
    assert "unable to parse" not in message


def test_the_duration_grammar_says_that_a_bare_number_is_seconds() -> None:
    from efo.config import DURATION_ALLOWED

    assert "number of seconds" in DURATION_ALLOWED and "5m" in DURATION_ALLOWED and "90s" in DURATION_ALLOWED


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("EFO_STRAEM", "did you mean EFO_STREAM?"),
        ("EFO_SHUTDOWN_TIMEOUT", "did you mean EFO_SHUTDOWN_TIMEOUT_S?"),
        ("EFO_POOL__MAX_PENDING_BYTE", "did you mean pool.max_pending_bytes (EFO_POOL__MAX_PENDING_BYTES)?"),
        ("EFO_BATCH__MAX_WAIT", "did you mean batch.max_wait_s (EFO_BATCH__MAX_WAIT_S)?"),
    ],
)
def test_a_misspelt_variable_nested_or_not_is_told_the_nearest_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, suggestion: str
) -> None:
    message = _config_error(monkeypatch, **{variable: "1"})
    assert "is not a setting" in message and suggestion in message


def test_a_misspelt_key_of_the_yaml_file_nested_or_not_is_told_the_nearest_setting(tmp_path: Path) -> None:
    config = tmp_path / "efo.yaml"
    config.write_text("stream: orders\napp: a\nsink: console\nsinks: console\nbatch: {max_record: 5}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    message = str(info.value)
    assert "sinks (EFO_SINKS) is not a setting; did you mean sink (EFO_SINK)?" in message
    assert "batch.max_record (EFO_BATCH__MAX_RECORD) is not a setting; did you mean batch.max_records" in message


def test_a_key_far_from_every_setting_gets_no_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _config_error(monkeypatch, EFO_POOL__ZZZZZZZZ="1")
    assert "pool.zzzzzzzz (EFO_POOL__ZZZZZZZZ) is not a setting" in message and "did you mean" not in message


def test_a_misspelt_key_of_a_streams_entry_is_told_the_nearest_one(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _streams_error(monkeypatch, streams=[{"stream": "orders", "initial_positon": "LATEST"}])
    assert "entry 1 has 'initial_positon'" in message and "did you mean 'initial_position'?" in message


@pytest.mark.parametrize("region", ["eu-west-1", "us-gov-west-1", "cn-north-1", "ap-southeast-5", "us-isob-east-1"])
def test_a_region_of_aws_form_is_taken(monkeypatch: pytest.MonkeyPatch, region: str) -> None:
    _env(monkeypatch, **REQUIRED, EFO_REGION=region)
    assert load_settings().region == region


@pytest.mark.parametrize("region", ["bad", "eu-west", "EU-WEST-1", "eu_west_1", "eu-west-1a"])
def test_a_region_not_of_aws_form_is_refused_naming_the_form(monkeypatch: pytest.MonkeyPatch, region: str) -> None:
    message = _config_error(monkeypatch, EFO_REGION=region)
    assert f"region (EFO_REGION) = {region!r}: allowed: an AWS region such as eu-west-1" in message


def test_a_duration_that_is_not_a_number_is_refused_as_before_units(tmp_path: Path) -> None:
    # YAML's .nan is a float: gt=0 refused it before durations took units (NaN > 0 is false).
    config = tmp_path / "efo.yaml"
    required = {k.removeprefix("EFO_").lower(): v for k, v in REQUIRED.items()}
    for text in ("batch: {max_wait_s: .nan}", "sink_retry: {retry_backoff_s: .nan}"):
        config.write_text(text + "\n")
        with pytest.raises(ConfigError) as refused:
            load_settings(config, **required)
        assert "= nan: allowed: a duration" in str(refused.value)


@pytest.mark.parametrize(
    ("failover", "heartbeat", "accepted"), [("4", "2", False), ("5.9", "2", False), ("6", "2", True)]
)
def test_the_failover_is_at_least_three_heartbeat_intervals(
    monkeypatch: pytest.MonkeyPatch, failover: str, heartbeat: str, accepted: bool
) -> None:
    """Found in review: at twice the interval a worker trusts its leases for one interval after a
    heartbeat's send (efo.worker.liveness), so any latency at all ran out each one's validity before
    the next landed: in doubt at every beat (30 lapses in 60 s at 50 ms), its leases taken each time.
    At three intervals a heartbeat may take up to one interval to land."""
    _env(monkeypatch, **REQUIRED, EFO_LEASE__FAILOVER_S=failover, EFO_LEASE__HEARTBEAT_INTERVAL_S=heartbeat)
    if accepted:
        assert load_settings().lease.failover_s == float(failover)
        return
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "lease.failover_s (EFO_LEASE__FAILOVER_S)" in message and "three times" in message, message
    assert "lease.heartbeat_interval_s (EFO_LEASE__HEARTBEAT_INTERVAL_S)" in message, message
