"""Bounded runs (``efo run --until``, ``run.until``): the rule's settings, and the CLI's exit 2."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from efo.cli import main
from efo.config import Until, load_settings, setting_sources
from efo.errors import EXIT_CONFIG, ConfigError

REQUIRED = {"EFO_STREAM": "orders", "EFO_APP": "orders-app", "EFO_SINK": "console"}
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)


def _error(**values: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(**values)
    assert info.value.exit_code == EXIT_CONFIG
    return str(info.value)


@pytest.mark.parametrize("text", ["caught-up", "CAUGHT-UP", " caught_up "])
def test_caught_up_is_a_bound_without_a_time(text: str) -> None:
    until = Until.parse(text, NOW)
    assert until.caught_up and until.time is None and str(until) == "caught-up"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-25T10:00:00Z", datetime(2026, 11, 25, 10, 0, tzinfo=UTC)),
        ("2026-11-25T10:00:00", datetime(2026, 11, 25, 10, 0, tzinfo=UTC)),  # no offset: UTC
        ("2026-11-25T11:00:00+01:00", datetime(2026, 11, 25, 10, 0, tzinfo=UTC)),
        ("2h", NOW - timedelta(hours=2)),
        ("90s", NOW - timedelta(seconds=90)),
        ("1d", NOW - timedelta(days=1)),
    ],
)
def test_a_time_or_a_duration_ago_is_one_fixed_moment_in_utc(text: str, expected: datetime) -> None:
    until = Until.parse(text, NOW)
    assert until.time == expected and until.time_ms == int(expected.timestamp() * 1000)


def test_a_duration_is_resolved_once_when_the_settings_are_loaded() -> None:
    before = datetime.now(UTC)
    settings = load_settings(run={"until": "2h"})
    bound = settings.run.bound
    assert bound is not None and bound.time is not None
    assert before - timedelta(hours=2, seconds=1) <= bound.time <= datetime.now(UTC) - timedelta(hours=2)
    assert settings.run.bound == bound  # the stored value is the moment, not "2h" again


def test_unset_means_a_run_without_an_end() -> None:
    assert load_settings().run.bound is None
    assert load_settings(run={"until": " "}).run.bound is None


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01T00:00:00Z", "-2h", "0s", "caught up now"])
def test_an_unparsable_until_names_the_field_and_what_is_allowed(text: str) -> None:
    message = _error(run={"until": text})
    assert "run.until (EFO_RUN__UNTIL)" in message and "allowed: caught-up" in message


@pytest.mark.parametrize("text", ["2026", "3600", "1.5", "-7"])
def test_a_number_without_a_unit_is_not_taken_for_seconds_ago(text: str) -> None:
    """``--until 2026`` is not 2026 s ago (nor ``20260131`` 234 days ago): a duration needs its unit."""
    with pytest.raises(ValueError, match="unit"):
        Until.parse(text, NOW)
    message = _error(run={"until": text})
    assert "run.until (EFO_RUN__UNTIL)" in message and "--until" in message and "90s" in message


def test_an_iso_basic_date_is_a_time_not_a_duration() -> None:
    assert Until.parse("20260131", NOW).time == datetime(2026, 1, 31, tzinfo=UTC)


def test_efo_run_with_a_unitless_until_exits_2_naming_the_field_and_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--until", "2026"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("efo: invalid configuration: run.until") and "--until" in err


def test_a_time_in_the_future_names_the_field() -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    message = _error(run={"until": later})
    assert "run.until (EFO_RUN__UNTIL)" in message and "in the future" in message


def test_until_not_after_an_at_timestamp_initial_position_is_an_empty_window() -> None:
    start = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    message = _error(run={"until": "2h"}, initial_position=f"AT_TIMESTAMP:{start}")
    assert "run.until (EFO_RUN__UNTIL)" in message and "initial_position (EFO_INITIAL_POSITION)" in message
    assert "first start" in message and "remove initial_position" in message, "what to do for an application that ran"
    assert load_settings(run={"until": "30m"}, initial_position=f"AT_TIMESTAMP:{start}").run.bound is not None


def test_until_older_than_skip_older_than_would_skip_everything() -> None:
    message = _error(run={"until": "2h"}, skip_older_than="1h")
    assert "run.until (EFO_RUN__UNTIL)" in message and "skip_older_than (EFO_SKIP_OLDER_THAN)" in message
    assert load_settings(run={"until": "caught-up"}, skip_older_than="1h").run.bound is not None


def test_the_flag_wins_over_the_environment_and_is_named_as_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_RUN__UNTIL", "2h")
    monkeypatch.setenv("EFO_RUN__SHARD_TIMEOUT_S", "7")
    settings = load_settings(flags={"run": {"until": "caught-up"}})
    assert settings.run.until == "caught-up" and settings.run.shard_timeout_s == 7  # siblings kept
    sources = setting_sources(flags={"run": {"until": "caught-up"}})
    assert (sources["run.until"].kind, sources["run.until"].origin) == ("flag", "--until")
    assert sources["run.shard_timeout_s"].kind == "environment"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--until", "soon"], "run.until (EFO_RUN__UNTIL) = 'soon'"),
        (["--until", "2999-01-01T00:00:00Z"], "in the future"),
    ],
)
def test_efo_run_with_a_bad_until_exits_2_naming_the_field_before_any_aws_call(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *args]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("efo: invalid configuration: run.until") and named in err
