"""``efo config show``: the values ``efo run`` would use, not placeholders. A setting whose default
is another setting (``table``, ``consumer_name``: the application) shows that value; the region
the AWS SDK would pick shows as such; a required setting that is not set (``sink``) says so instead
of showing a made-up default. No AWS call is made."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from efo.cli import cli
from efo.cli.configuration import settings_records


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith(("EFO_", "AWS_")):
            monkeypatch.delenv(name)
    # No profile of the developer's: the SDK's region comes from this test alone.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("EFO_STREAM", "orders")
    monkeypatch.setenv("EFO_APP", "orders-app")
    return monkeypatch


def shown(records: list[dict[str, Any]], setting: str, stream: str | None = None) -> tuple[Any, str, str | None]:
    [record] = [r for r in records if r["setting"] == setting and r["stream"] == stream]
    return record["value"], record["source"], record["origin"]


def test_table_and_consumer_name_show_the_application_they_default_to() -> None:
    records = settings_records(None, None, None)
    assert shown(records, "table") == ("orders-app", "default", "app")
    assert shown(records, "consumer_name") == ("orders-app", "default", "app")
    assert shown(records, "consumer_name", "orders") == ("orders-app", "default", "app")


def test_a_table_or_consumer_set_shows_as_set(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("EFO_TABLE", "leases")
    clean_env.setenv("EFO_CONSUMER_NAME", "fanout")
    records = settings_records(None, None, None)
    assert shown(records, "table") == ("leases", "environment", "EFO_TABLE")
    assert shown(records, "consumer_name") == ("fanout", "environment", "EFO_CONSUMER_NAME")


def test_a_consumer_arn_leaves_no_consumer_name_to_default(clean_env: pytest.MonkeyPatch) -> None:
    arn = "arn:aws:kinesis:eu-west-1:1:stream/orders/consumer/c:1"
    clean_env.setenv("EFO_CONSUMER_ARN", arn)
    records = settings_records(None, None, None)
    assert shown(records, "consumer_name") == (None, "default", None)
    assert shown(records, "consumer_arn") == (arn, "environment", "EFO_CONSUMER_ARN")


def test_a_sink_not_set_shows_as_missing_not_as_a_default(clean_env: pytest.MonkeyPatch) -> None:
    assert shown(settings_records(None, None, None), "sink") == (None, "missing", None)
    clean_env.setenv("EFO_SINK", "parquet:/tmp/out")
    assert shown(settings_records(None, None, None), "sink") == ("parquet:/tmp/out", "environment", "EFO_SINK")


def test_the_region_unset_shows_the_one_the_aws_sdk_picks_and_from_where(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert shown(settings_records(None, None, None), "region") == (None, "default", None)
    clean_env.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    assert shown(settings_records(None, None, None), "region") == ("eu-west-3", "default", "AWS_DEFAULT_REGION")
    clean_env.delenv("AWS_DEFAULT_REGION")
    profile = tmp_path / "config"
    profile.write_text("[default]\nregion = ap-south-1\n")
    clean_env.setenv("AWS_CONFIG_FILE", str(profile))
    assert shown(settings_records(None, None, None), "region") == ("ap-south-1", "default", f"AWS profile in {profile}")
    clean_env.setenv("EFO_REGION", "us-east-2")
    assert shown(settings_records(None, None, None), "region") == ("us-east-2", "environment", "EFO_REGION")


def test_the_table_printed_says_missing_and_where_a_default_comes_from() -> None:
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.output.split("\n\n")[0].splitlines()[1:]}
    assert rows["sink"] == ["-", "missing", "(required", "by", "efo", "run)"]
    assert rows["table"] == ["orders-app", "default", "(app)"]
    assert rows["consumer_name"] == ["orders-app", "default", "(app)"]
    assert rows["batch.max_records"] == ["50000", "default"]


def test_an_aws_profile_that_does_not_exist_is_said_not_raised(clean_env: pytest.MonkeyPatch) -> None:
    # config show makes no AWS call and reads no credentials: a profile botocore cannot find (AWS_PROFILE)
    # leaves the region unknown, and says why, instead of a ProfileNotFound traceback.
    clean_env.setenv("AWS_PROFILE", "no-such-profile")
    value, source, origin = shown(settings_records(None, None, None), "region")
    assert (value, source) == (None, "default") and origin is not None and "'no-such-profile'" in origin
