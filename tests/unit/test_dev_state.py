"""Where ``efo dev`` keeps its stack's state: one place per user, whatever the directory."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from efo.devstack.cli import SHELL_VARIABLES, add_dev_commands, default_state_dir, main


def test_the_state_lives_per_user_unless_a_variable_says_otherwise() -> None:
    home = Path.home()
    assert default_state_dir({}) == home / ".local" / "state" / "efo" / "dev"
    assert default_state_dir({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/efo/dev")
    both = {"XDG_STATE_HOME": "/x/state", "EFO_DEV_STATE_DIR": "/y/dev"}
    assert default_state_dir(both) == Path("/y/dev")
    assert default_state_dir({"EFO_DEV_STATE_DIR": "~/dev"}) == home / "dev"


def test_env_unset_names_every_variable_env_sets_and_needs_no_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "env", "--unset", "--state-dir", "/nonexistent"]) == 0
    assert capsys.readouterr().out.split() == ["unset", *SHELL_VARIABLES]
    assert "AWS_DEFAULT_REGION" in SHELL_VARIABLES and "EFO_KINESIS_ENDPOINT" in SHELL_VARIABLES


def test_a_command_without_a_stack_says_where_it_looked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["dev", "put", "orders", "--state-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"no stack state in {tmp_path / 'stack.json'}" in error and "efo dev up" in error


def test_a_duration_option_takes_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_dev_commands(parser.add_subparsers())
    assert parser.parse_args(["dev", "stream", "create", "orders", "--wait-s", "2m"]).wait_s == 120.0
    assert parser.parse_args(["dev", "up", "--subscription-lifetime-s", "90s"]).subscription_lifetime_s == 90.0
    assert parser.parse_args(["dev", "stream", "create", "orders", "--wait-s", "45"]).wait_s == 45.0
    with pytest.raises(SystemExit) as exited:
        main(["dev", "stream", "create", "orders", "--wait-s", "soon"])
    assert exited.value.code == 2
    assert "allowed: a duration" in capsys.readouterr().err


def test_stream_list_leaves_out_a_stream_deleted_between_the_listing_and_its_description(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream being deleted is listed, then not found: the list shows the others, no traceback."""
    import argparse
    import json

    import botocore.exceptions

    from efo.devstack import cli as dev

    class Kinesis:
        def list_streams(self, **request: object) -> dict[str, object]:
            return {"StreamNames": ["gone", "orders"], "HasMoreStreams": False}

        def describe_stream_summary(self, StreamName: str) -> dict[str, object]:
            if StreamName == "gone":
                error = {"Error": {"Code": "ResourceNotFoundException", "Message": "not found"}}
                raise botocore.exceptions.ClientError(error, "DescribeStreamSummary")  # type: ignore[arg-type]
            return {"StreamDescriptionSummary": {"StreamStatus": "ACTIVE", "OpenShardCount": 2}}

    monkeypatch.setattr(dev, "_running_stack", lambda args: object())
    monkeypatch.setattr(dev, "_kinesis", lambda endpoints: Kinesis())
    assert dev.cmd_stream_list(argparse.Namespace(json=True)) == 0
    assert json.loads(capsys.readouterr().out) == [{"stream": "orders", "status": "ACTIVE", "open_shards": 2}]


def test_stream_delete_says_deleted_only_once_the_stream_is_gone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by CI (tests/integration/test_dev_cli.py): kinesis-local deletes a stream some time after
    DeleteStream answers; `efo dev stream delete` said 'deleted' and the next list still showed it,
    DELETING. It waits until the stream is gone, and says so if it is not within --wait-s."""
    import botocore.exceptions

    from efo.devstack import cli as dev

    class Kinesis:
        def __init__(self, described_before_gone: int) -> None:
            self.left = described_before_gone

        def delete_stream(self, **request: object) -> None:
            pass

        def describe_stream_summary(self, StreamName: str) -> dict[str, object]:
            if self.left == 0:
                error = {"Error": {"Code": "ResourceNotFoundException", "Message": "not found"}}
                raise botocore.exceptions.ClientError(error, "DescribeStreamSummary")  # type: ignore[arg-type]
            self.left -= 1
            return {"StreamDescriptionSummary": {"StreamStatus": "DELETING", "OpenShardCount": 0}}

    kinesis = Kinesis(described_before_gone=3)
    monkeypatch.setattr(dev, "_running_stack", lambda args: object())
    monkeypatch.setattr(dev, "_kinesis", lambda endpoints: kinesis)
    assert dev.cmd_stream_delete(argparse.Namespace(name="orders", wait_s=5.0)) == 0
    assert kinesis.left == 0 and "stream 'orders' deleted" in capsys.readouterr().out
    kinesis = Kinesis(described_before_gone=10**6)
    assert dev.cmd_stream_delete(argparse.Namespace(name="orders", wait_s=0.3)) == 1
    assert "stream 'orders' is still DELETING after 0.3 s" in capsys.readouterr().err
