"""Item sizes and units as DynamoDB bills them on demand (efo/devstack/units.py), checked against the
rules and the worked examples of AWS's developer guide ("DynamoDB item sizes and formats", "DynamoDB
read and write operations"), and the bounded tally behind ``/_efo/usage``."""

from __future__ import annotations

import base64

import pytest

from efo.devstack.units import (
    OTHER_PARTITIONS,
    Charge,
    Usage,
    UsageCounters,
    attribute_value_size,
    item_size,
    partition_label,
    read_units,
    write_units,
)

KB = 1024


def test_a_string_is_its_utf8_bytes_and_a_name_counts_as_its_utf8_bytes() -> None:
    assert item_size({"name": {"S": "abc"}}) == 4 + 3
    assert item_size({"né": {"S": "héllo"}}) == 3 + 6
    assert item_size({"empty": {"S": ""}}) == 5


@pytest.mark.parametrize(
    ("number", "size"),
    [
        ("1", 2),  # one significant digit: 1 byte for it, 1 more
        ("12", 2),
        ("123", 3),
        ("12345", 4),
        ("0012.3400", 3),  # leading and trailing zeros trimmed: 1234
        ("1000000", 2),  # 1
        ("-1.5E+3", 2),  # 15
        ("0", 2),
        ("12345678901234567890123456789012345678", 20),  # 38 digits, the most DynamoDB keeps
    ],
)
def test_a_number_is_a_byte_per_two_significant_digits_plus_one(number: str, size: int) -> None:
    assert attribute_value_size({"N": number}) == size


def test_a_binary_is_its_raw_length_whether_base64_off_the_wire_or_bytes_from_moto() -> None:
    raw = bytes(range(200))
    assert attribute_value_size({"B": base64.b64encode(raw).decode()}) == 200
    assert attribute_value_size({"B": raw}) == 200
    assert attribute_value_size({"BS": [b"ab", base64.b64encode(b"cde").decode()]}) == 5


def test_null_and_boolean_are_one_byte_and_sets_the_sum_of_their_elements() -> None:
    assert item_size({"a": {"NULL": True}, "b": {"BOOL": False}}) == 1 + 1 + 1 + 1
    assert attribute_value_size({"SS": ["ab", "é"]}) == 2 + 2
    assert attribute_value_size({"NS": ["1", "12345"]}) == 2 + 4


def test_a_list_or_map_is_3_bytes_plus_1_per_element_plus_the_elements_and_map_names() -> None:
    assert attribute_value_size({"L": []}) == 3
    assert attribute_value_size({"M": {}}) == 3
    assert attribute_value_size({"L": [{"S": "ab"}, {"N": "7"}]}) == 3 + (1 + 2) + (1 + 2)
    assert attribute_value_size({"M": {"k": {"S": "ab"}, "nested": {"L": [{"NULL": True}]}}}) == (
        3 + (1 + 1 + 2) + (1 + 6 + (3 + 1 + 1))
    )


def test_an_item_is_the_sum_of_its_attributes_and_no_item_is_nothing() -> None:
    item = {"pk": {"S": "app|stream"}, "sk": {"S": "shard#0001"}, "counter": {"N": "42"}}
    assert item_size(item) == (2 + 10) + (2 + 10) + (7 + 2)
    assert item_size(None) == 0 and item_size({}) == 0


def test_reads_round_up_to_4_kb_halved_when_eventually_consistent_doubled_in_a_transaction() -> None:
    assert read_units(3500, consistent=True) == 1  # "reading a 3,500-byte item ... same as a 4 KB item"
    assert read_units(8 * KB, consistent=True) == 2  # "an item of 8 KB: 2 read units strongly consistent,
    assert read_units(8 * KB, consistent=False) == 1  # 1 eventually consistent,
    assert read_units(8 * KB, consistent=True, transactional=True) == 4  # 4 transactional"
    assert read_units(10 * KB, consistent=True) == 3  # "a 10 KB item ... rounded up to 12 KB"
    # BatchGetItem of 1.5 KB and 6.5 KB items: each rounded up, 4 KB + 8 KB = 12 KB, not 8 KB.
    assert read_units(1536, consistent=True) + read_units(6656, consistent=True) == 3
    assert read_units(0, consistent=True) == 1 and read_units(0, consistent=False) == 0.5  # nothing found


def test_writes_round_up_to_1_kb_per_item_doubled_in_a_transaction() -> None:
    assert write_units(500) == 1
    assert write_units(1536) == 2  # "1.5 KB ... rounded up to 2 KB"
    assert write_units(3584) == 4  # 3.5 KB
    assert write_units(3584, transactional=True) == 8
    assert write_units(0) == 1  # deleting an item that is not there still costs a unit


def test_partition_labels_are_the_key_values_as_text() -> None:
    assert partition_label({"S": "app|arn"}) == "app|arn"
    assert partition_label({"N": "12"}) == "12"
    assert partition_label({"B": b"\x00\x01"}) == "AAE="
    assert partition_label(None) is None


def test_the_tally_counts_each_request_once_per_partition_and_caps_the_partitions_it_names() -> None:
    counters = UsageCounters(max_partitions=2)
    counters.record("PutItem", [Charge("a", write_units=1, bytes=100)])
    counters.record("BatchWriteItem", [Charge("a", write_units=2, bytes=10), Charge("b", write_units=1, bytes=20)])
    counters.record(
        "BatchWriteItem", [Charge("c", write_units=3), Charge("d", write_units=4), Charge("a", write_units=1)]
    )
    counters.record("DescribeTable", [])
    report = counters.to_json()
    assert report["operations"] == {
        "PutItem": {"requests": 1, "read_units": 0, "write_units": 1, "bytes": 100},
        "BatchWriteItem": {"requests": 2, "read_units": 0, "write_units": 11, "bytes": 30},
        "DescribeTable": {"requests": 1, "read_units": 0, "write_units": 0, "bytes": 0},
    }
    assert report["partitions"] == {
        "a": {"requests": 3, "read_units": 0, "write_units": 4},
        "b": {"requests": 1, "read_units": 0, "write_units": 1},
        OTHER_PARTITIONS: {"requests": 1, "read_units": 0, "write_units": 7},  # c and d, one request
    }
    usage = Usage.from_json(report)
    assert (usage.requests, usage.write_units, usage.read_units) == (4, 12, 0)
    assert usage.busiest_partition("write_units") == ("(other)", usage.partitions["(other)"])
    counters.clear()
    assert counters.to_json() == {"operations": {}, "partitions": {}}
