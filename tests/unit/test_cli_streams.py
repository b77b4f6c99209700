"""Which stream(s) an operator command works on, with which settings, and the refusals (issue 20:
several streams in one application). No AWS: every case here is decided before any call."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from efo import spark_side
from efo.cli import main
from efo.cli.common import Covered, load_for_stream, load_scopes, select_stream
from efo.cli.configuration import settings_records
from efo.config import load_settings
from efo.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_OK, ConfigError

ORDERS_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
YAML = """
app: billing
sink: console
initial_position: TRIM_HORIZON
consumer_name: shared
streams:
  - orders
  - stream: payments
    initial_position: LATEST
    consumer_name: pay
  - stream: arn:aws:kinesis:us-east-1:000000000000:stream/refunds
    skip_older_than: 2h
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No EFO_* variable of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "efo.yaml"
    path.write_text(YAML)
    return str(path)


def _scopes(config: str | None, stream: str | None = None, app: str | None = None) -> list[tuple[str, Any]]:
    return [
        (scope.stream, scope.settings.initial_position, scope.consumer_name, scope.settings.skip_older_than)
        for scope in load_scopes(config, stream, app, need_app=True)
    ]


# ---- which streams, with which settings ----------------------------------------------------------


def test_without_stream_every_configured_stream_in_order_with_its_effective_settings(config: str) -> None:
    assert _scopes(config) == [
        ("orders", "TRIM_HORIZON", "shared", None),
        ("payments", "LATEST", "pay", None),
        ("arn:aws:kinesis:us-east-1:000000000000:stream/refunds", "TRIM_HORIZON", "shared", "7200s"),
    ]


@pytest.mark.parametrize("flag", ["payments", "arn:aws:kinesis:us-east-1:000000000000:stream/payments"])
def test_stream_selects_a_configured_entry_by_name_or_arn_with_its_own_settings(config: str, flag: str) -> None:
    assert _scopes(config, flag) == [("payments", "LATEST", "pay", None)]


def test_stream_selects_an_entry_given_as_an_arn_by_its_name(config: str) -> None:
    assert _scopes(config, "refunds") == [
        ("arn:aws:kinesis:us-east-1:000000000000:stream/refunds", "TRIM_HORIZON", "shared", "7200s")
    ]


def test_a_stream_removed_from_the_list_is_reachable_with_the_top_level_settings(config: str) -> None:
    assert _scopes(config, "archived") == [("archived", "TRIM_HORIZON", "shared", None)]


def test_stream_with_streams_in_the_environment_selects_one_instead_of_colliding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFO_STREAMS", "orders,payments")
    monkeypatch.setenv("EFO_APP", "billing")
    monkeypatch.setenv("EFO_SINK", "console")
    assert [stream for stream, *_ in _scopes(None)] == ["orders", "payments"]
    assert [stream for stream, *_ in _scopes(None, "payments")] == ["payments"]
    selected = load_for_stream(None, "payments")
    assert selected.stream == "payments" and selected.streams is None
    with pytest.raises(ConfigError, match=r"stream \(EFO_STREAM\) = 'payments' and streams \(EFO_STREAMS\)"):
        load_settings(flags={"stream": "payments"})  # what passing it as a plain flag would do


def test_stream_over_a_single_stream_setting_wins_as_every_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_STREAM", "orders")
    monkeypatch.setenv("EFO_APP", "billing")
    assert _scopes(None) == [("orders", "LATEST", "billing", None)]
    assert _scopes(None, "payments") == [("payments", "LATEST", "billing", None)]


def test_without_any_stream_the_error_names_the_flag_and_both_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_APP", "billing")
    with pytest.raises(ConfigError) as info:
        load_scopes(None, None, None, need_app=False)
    assert str(info.value) == "no stream given: pass --stream NAME, or set EFO_STREAM (or EFO_STREAMS for several)"


def test_without_an_application_the_scopes_have_none_unless_it_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_STREAMS", "orders,payments")
    assert [scope.app for scope in load_scopes(None, None, None, need_app=False)] == [None, None]
    with pytest.raises(ConfigError, match="no application given: pass --app NAME"):
        load_scopes(None, None, None, need_app=True)


def test_select_stream_keeps_the_entry_consumer_over_the_top_level(config: str) -> None:
    settings = load_settings(config)
    payments = select_stream(settings, "payments")
    assert (payments.consumer_name, payments.initial_position, payments.streams) == ("pay", "LATEST", None)
    assert select_stream(settings, " archived ").stream == "archived"


# ---- one-stream commands refuse several streams without --stream ---------------------------------

ONE_STREAM_COMMANDS = [
    ["checkpoints", "reset", "--all", "--to", "LATEST", "--yes"],
    ["checkpoints", "reset", "--delete-all", "--yes"],
    ["checkpoints", "migrate", "--yes"],
    ["consumers", "register"],
    ["consumers", "deregister", "--name", "old", "--yes"],
    ["consumers", "describe"],
]


@pytest.mark.parametrize("args", ONE_STREAM_COMMANDS, ids=" ".join)
def test_commands_acting_on_one_stream_refuse_several_without_stream(
    config: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--config", config]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    command = " ".join(arg for arg in args[:2] if not arg.startswith("-"))
    assert out == ""
    assert err == (
        f"efo: 'efo {command}' acts on one stream and 3 are configured (orders, payments, refunds): "
        "pass --stream NAME\n"
    )


def test_a_single_entry_in_streams_needs_no_stream_flag(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text("app: billing\nstreams: [orders]\n")
    [scope] = load_scopes(str(path), None, None, need_app=True)
    assert scope.stream == "orders" and scope.app == "billing"


# ---- config validate and show --------------------------------------------------------------------


def test_config_validate_names_every_stream(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", "--config", config]) == EXIT_OK
    assert (
        capsys.readouterr().out == "configuration is valid: streams=orders,payments,refunds app=billing sink=console\n"
    )
    assert main(["config", "validate", "--config", config, "--stream", "payments"]) == EXIT_OK
    assert capsys.readouterr().out == "configuration is valid: stream=payments app=billing sink=console\n"


def _stream_settings(records: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, str, str | None, Any]]:
    return {
        (r["stream"], r["setting"]): (r["value"], r["source"], r["origin"], r["entry"])
        for r in records
        if r["stream"] is not None
    }


def test_config_show_says_whether_the_entry_the_top_level_or_the_default_set_each_streams_settings(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EFO_SKIP_OLDER_THAN", "15m")
    records = settings_records(config, None, None)
    assert {r["setting"] for r in records if r["stream"] is None} >= {
        "stream",
        "streams",
        "app",
        "pool.max_pending_records",
    }
    shown = _stream_settings(records)
    assert [stream for stream, setting in shown if setting == "stream"] == ["orders", "payments", "refunds"]
    assert shown["orders", "stream"] == ("orders", "file", config, 1)
    assert shown["orders", "initial_position"] == ("TRIM_HORIZON", "file", config, None)  # the top level
    assert shown["orders", "skip_older_than"] == ("900s", "environment", "EFO_SKIP_OLDER_THAN", None)
    assert shown["orders", "consumer_arn"] == (None, "default", None, None)
    assert shown["payments", "initial_position"] == ("LATEST", "file", config, 2)
    assert shown["payments", "consumer_name"] == ("pay", "file", config, 2)
    assert shown["refunds", "skip_older_than"] == ("7200s", "file", config, 3)  # the entry over the environment


def test_config_show_with_stream_shows_that_stream_or_a_removed_one_from_the_top_level(config: str) -> None:
    selected = _stream_settings(settings_records(config, "payments", None))
    assert {stream for stream, _ in selected} == {"payments"}
    removed = _stream_settings(settings_records(config, "archived", None))
    assert removed["archived", "stream"] == ("archived", "flag", "--stream", None)
    assert removed["archived", "initial_position"] == ("TRIM_HORIZON", "file", config, None)


def test_config_show_of_one_stream_has_the_same_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_STREAM", "orders")
    monkeypatch.setenv("EFO_APP", "billing")
    records = settings_records(None, None, None)
    assert all(set(r) == {"stream", "setting", "value", "source", "origin", "entry"} for r in records)
    shown = _stream_settings(records)
    assert shown["orders", "stream"] == ("orders", "environment", "EFO_STREAM", None)
    assert shown["orders", "initial_position"] == ("LATEST", "default", None, None)


# ---- what was not found, with several streams ----------------------------------------------------


def test_each_thing_not_found_is_its_own_line_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert Covered([1], []).report_missing() == EXIT_OK
    assert capsys.readouterr().err == ""
    missing = Covered([1], ["stream 'a' not found; create it", "stream 'b' not found; create it"])
    assert missing.report_missing() == EXIT_NOT_FOUND
    assert capsys.readouterr().err == "efo: stream 'a' not found; create it\nefo: stream 'b' not found; create it\n"


# ---- efo run --stream ----------------------------------------------------------------------------


class _FakeSparkSide:
    """The Spark side as ``efo run`` reaches it (efo.spark_side), recording the settings it runs with."""

    def __init__(self, ran: list[Any]) -> None:
        self.ran = ran

    def run(self, settings: Any) -> int:
        self.ran.append(settings)
        return EXIT_OK


def test_run_with_stream_runs_that_configured_stream_alone_with_its_settings(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(spark_side, "load", lambda: _FakeSparkSide(ran))
    assert main(["run", "--config", config, "--stream", "payments"]) == EXIT_OK
    assert main(["run", "--config", config]) == EXIT_OK
    selected, every = ran
    assert (selected.stream, selected.streams, selected.consumer_name) == ("payments", None, "pay")
    assert every.stream is None and every.stream_names == ["orders", "payments", "refunds"]


def test_run_with_a_stream_that_is_not_configured_is_refused_naming_the_configured_ones(
    config: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator commands reach a stream removed from the list; ``efo run`` does not read one
    nobody configured (a typo would start a new application's leases on the wrong stream)."""
    ran: list[Any] = []
    monkeypatch.setattr(spark_side, "load", lambda: _FakeSparkSide(ran))
    assert main(["run", "--config", config, "--stream", "paymnets"]) == EXIT_CONFIG
    assert ran == []
    err = capsys.readouterr().err
    assert "--stream 'paymnets' is not one of the configured streams" in err and "orders, payments, refunds" in err
