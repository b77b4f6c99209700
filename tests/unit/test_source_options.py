"""The Spark source's options (efo.source.options): every bad one named with what is allowed, and the
README's table generated from the declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from efo.errors import ConfigError
from efo.source.options import OPTIONS, SourceOptions, options_table, parse

README = Path(__file__).resolve().parents[2] / "README.md"
GOOD = {"streams": "orders", "consumerName": "lake"}


def error_of(**options: str) -> str:
    with pytest.raises(ConfigError) as raised:
        parse(options)
    return str(raised.value)


def test_the_fewest_options_are_a_stream_and_a_consumer_with_efos_defaults() -> None:
    parsed = parse(GOOD)
    assert parsed == SourceOptions(streams=("orders",), consumer_name="lake")
    assert str(parsed.starting_position) == "LATEST" and parsed.fail_on_data_loss


def test_names_are_matched_whatever_their_case_as_spark_lower_cases_them() -> None:
    parsed = parse(
        {
            "streams": "a,arn:aws:kinesis:eu-west-1:123456789012:stream/b",
            "consumername": "c",
            "MAXRECORDSPERTRIGGER": "7",
        }
    )
    assert parsed.streams == ("a", "arn:aws:kinesis:eu-west-1:123456789012:stream/b")
    assert parsed.stream_names() == ("a", "b") and parsed.max_records_per_trigger == 7


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("startingPosition", "yesterday", "allowed: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>"),
        ("startingPosition", "AT_TIMESTAMP:noon", "AT_TIMESTAMP needs an ISO-8601 time"),
        ("maxRecordsPerTrigger", "0", "allowed: a whole number above 0"),
        ("maxBytesPerTrigger", "1MB", "allowed: a whole number above 0"),
        ("skipOlderThan", "-5m", "allowed: a duration greater than 0"),
        ("onCorruptAggregate", "dead_letter", "allowed: passthrough or fail"),
        ("failOnDataLoss", "yes", "allowed: true or false"),
        ("metricsPort", "70000", "allowed: a port number"),
        ("endpoint", "localhost:4567", "allowed: an http:// or https:// URL"),
        ("region", "Europe", "allowed: an AWS region"),
        ("consumerArn", "lake", "allowed: a stream consumer's ARN"),
        ("shardTimeout", "soon", "allowed: a duration greater than 0"),
    ],
)
def test_a_bad_value_is_refused_naming_the_option_the_value_and_what_is_allowed(
    option: str, value: str, allowed: str
) -> None:
    message = error_of(**{**GOOD, option: value})
    assert message.startswith(f"efo source: option {option} = {value!r}: ")
    assert allowed in message


def test_an_unknown_option_is_refused_with_the_list_of_options() -> None:
    message = error_of(**GOOD, startingOffsets="earliest")
    assert "'startingoffsets' is not an option of the efo source" in message.lower()
    assert "startingPosition" in message


def test_streams_are_required_and_each_named_once() -> None:
    assert "option streams is required" in error_of(consumerName="c")
    assert "allowed: one or more stream names" in error_of(streams="a,,b", consumerName="c")
    message = error_of(streams="orders,arn:aws:kinesis:eu-west-1:123456789012:stream/orders", consumerName="c")
    assert "stream 'orders' is listed twice" in message


def test_exactly_one_consumer_and_an_arn_only_for_one_stream() -> None:
    assert "exactly one of the options consumerName" in error_of(streams="a")
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/a/consumer/c:1"
    assert "exactly one of the options consumerName" in error_of(streams="a", consumerName="c", consumerArn=arn)
    assert "option consumerArn" in error_of(streams="a,b", consumerArn=arn)
    assert parse({"streams": "a", "consumerArn": arn}).consumer_arn == arn


def test_every_option_sets_a_field_of_the_parsed_options() -> None:
    fields = set(SourceOptions.__dataclass_fields__)
    assert {option.field for option in OPTIONS} <= fields
    assert len({option.name.lower() for option in OPTIONS}) == len(OPTIONS)


def test_readme_options_table_is_the_generated_table_verbatim() -> None:
    match = re.search(r"<!-- source-options:start -->\n(.*?)\n<!-- source-options:end -->", README.read_text(), re.S)
    assert match is not None, "README.md lacks the source-options markers"
    assert match.group(1) == options_table()
