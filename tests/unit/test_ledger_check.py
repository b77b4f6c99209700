"""The invariant checker of the multi-worker and chaos tests (tests/integration/ledger_check.py):
its duplicate bound, and the sink's misbehaviour on request."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from tests.integration import ledger_check
from tests.integration.ledger_check import Checkpoint, Disruption, Produced, check


def commit(
    directory: Path, at_ns: int, worker: str, pid: int, *records: tuple[str, int, str], stream: str = "s"
) -> None:
    """One committed batch as the sink writes it: (shard, sequence number, data) per record."""
    rows = [
        {"stream": stream, "shard": shard, "seq": str(seq), "key": data.split(":")[0], "data": data}
        | {"worker": worker, "pid": pid, "batch": f"{at_ns:020d}-{stream}", "committed_ns": at_ns}
        for shard, seq, data in records
    ]
    (directory / f"{at_ns:020d}-{stream}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def produced(*records: tuple[str, int, str]) -> list[Produced]:
    return [Produced(shard, str(seq), data.split(":")[0], int(data.split(":")[1])) for shard, seq, data in records]


A5, A6, A7 = ("A", 5, "k:1"), ("A", 6, "k:2"), ("A", 7, "k:3")
B9, B10 = ("B", 9, "j:1"), ("B", 10, "j:2")


def test_a_duplicate_is_due_only_if_the_killed_process_committed_it_past_its_checkpoint(tmp_path: Path) -> None:
    commit(tmp_path, 1, "w1", 11, A5, A6, A7, B9)
    commit(tmp_path, 2, "w2", 22, A6, A7)  # w1 killed with shard A at AFTER 5: 6 and 7 read again
    kill = Disruption("SIGKILL w1", {"A": Checkpoint("AFTER_SEQUENCE_NUMBER", 5)}, frozenset({("w1", 11)}))
    verdict = check(produced(A5, A6, A7, B9), tmp_path, [kill])
    assert (verdict.duplicates, verdict.allowed, verdict.undue) == (2, 2, [])

    commit(tmp_path, 3, "w2", 22, A5, B9)  # 5 was checkpointed, and B was never the victim's
    verdict = check(produced(A5, A6, A7, B9), tmp_path, [kill])
    assert verdict.undue == [("A", "5"), ("B", "9")]
    assert check(produced(A5, A6, A7, B9), tmp_path).undue == [("A", "5"), ("A", "6"), ("A", "7"), ("B", "9")]


def test_each_kill_allows_one_more_copy_of_what_it_left_uncheckpointed_not_any_number(tmp_path: Path) -> None:
    commit(tmp_path, 1, "w1", 11, A6)
    commit(tmp_path, 2, "w2", 22, A6)  # w1 killed with A at AFTER 5: one copy is due
    commit(tmp_path, 3, "w3", 33, A6)  # w2 was not killed: a third copy nothing accounts for
    first = Disruption("SIGKILL w1", {"A": Checkpoint("AFTER_SEQUENCE_NUMBER", 5)}, frozenset({("w1", 11)}))
    verdict = check(produced(A6), tmp_path, [first])
    assert (verdict.duplicates, verdict.allowed, verdict.undue) == (2, 1, [("A", "6")])

    second = Disruption("SIGKILL w2", {"A": Checkpoint("AFTER_SEQUENCE_NUMBER", 5)}, frozenset({("w2", 22)}))
    verdict = check(produced(A6), tmp_path, [first, second])  # w2 killed before checkpointing it too
    assert (verdict.duplicates, verdict.allowed, verdict.undue) == (2, 2, [])


def test_a_restarted_worker_of_the_same_id_is_not_the_victim_it_replaces(tmp_path: Path) -> None:
    commit(tmp_path, 1, "w1", 11, A5)
    commit(tmp_path, 2, "w1", 12, A5, A6)  # the new process, same worker id
    commit(tmp_path, 3, "w2", 22, A6)
    kill = Disruption("SIGKILL w1", {"A": Checkpoint("TRIM_HORIZON")}, frozenset({("w1", 11)}))
    assert check(produced(A5, A6), tmp_path, [kill]).undue == [("A", "6")]


def test_an_outage_accounts_for_every_process_but_only_for_what_was_committed_before_it_ended(tmp_path: Path) -> None:
    commit(tmp_path, 100, "w1", 11, A6)
    commit(tmp_path, 200, "w2", 22, B10)
    commit(tmp_path, 300, "w2", 22, A6, B10, A7)
    commit(tmp_path, 400, "w1", 11, A7)  # after the outage ended: not the outage's doing
    checkpoints = {"A": Checkpoint("AFTER_SEQUENCE_NUMBER", 5), "B": Checkpoint("AT_SEQUENCE_NUMBER", 10)}
    pause = Disruption("DynamoDB paused", checkpoints, until_ns=250)
    verdict = check(produced(A6, A7, B10), tmp_path, [pause])
    assert verdict.undue == [("A", "7")] and verdict.allowed == 2


def test_a_disruption_of_one_stream_accounts_for_nothing_of_another_with_the_same_shard_ids(tmp_path: Path) -> None:
    commit(tmp_path, 1, "w1", 11, A6, stream="orders")
    commit(tmp_path, 1, "w1", 11, A6, stream="clicks")
    commit(tmp_path, 2, "w2", 22, A6, stream="orders")  # w1 killed: each stream's A read again
    commit(tmp_path, 2, "w2", 22, A6, stream="clicks")
    checkpoints = {"A": Checkpoint("AFTER_SEQUENCE_NUMBER", 5)}
    kill = {
        name: Disruption("SIGKILL w1", checkpoints, frozenset({("w1", 11)}), stream=name)
        for name in ("orders", "clicks")
    }
    both = list(kill.values())
    assert check(produced(A6), tmp_path, both, stream="orders").undue == []
    assert check(produced(A6), tmp_path, both, stream="clicks").undue == []
    assert check(produced(A6), tmp_path, [kill["orders"]], stream="clicks").undue == [("A", "6")]
    assert check(produced(A6), tmp_path, [kill["orders"]], stream="orders").allowed == 1


@pytest.mark.parametrize(
    ("checkpoint", "read_again"),
    [
        (Checkpoint("SHARD_END"), []),
        (Checkpoint("TRIM_HORIZON"), ["9", "10", "100"]),
        (Checkpoint("AT_TIMESTAMP"), ["9", "10", "100"]),
        (Checkpoint("AT_SEQUENCE_NUMBER", 10), ["10", "100"]),
        (Checkpoint("AFTER_SEQUENCE_NUMBER", 10), ["100"]),  # integers, not strings: "9" > "10" as text
    ],
)
def test_what_a_checkpoint_reads_again(checkpoint: Checkpoint, read_again: list[str]) -> None:
    assert [seq for seq in ("9", "10", "100") if checkpoint.reads_again(seq)] == read_again


def test_a_checkpoint_from_a_lease_row() -> None:
    row = {"position_kind": {"S": "AFTER_SEQUENCE_NUMBER"}, "sequence_number": {"S": "4955"}}
    assert Checkpoint.of(row) == Checkpoint("AFTER_SEQUENCE_NUMBER", 4955)
    assert Checkpoint.of({"position_kind": {"S": "SHARD_END"}}) == Checkpoint("SHARD_END")


class Batch:
    batch_id = "run-00000001"


TABLE = pa.table(
    {"stream": ["orders"], "shard_id": ["A"], "sequence_number": ["5"], "partition_key": ["k"], "data": [b"k:1"]},
)


@pytest.fixture
def sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ledger_check.OUTPUT_ENV, str(tmp_path))
    monkeypatch.setattr(ledger_check, "_calls", itertools.count(1))
    monkeypatch.setattr(ledger_check, "_written", itertools.count(1))
    return tmp_path


def write(times: int) -> list[str]:
    outcomes = []
    for _ in range(times):
        try:
            ledger_check.write(TABLE, Batch())
            outcomes.append("ok")
        except ledger_check.InjectedSinkFailure:
            outcomes.append("failed")
    return outcomes


def test_the_sink_fails_every_nth_call_before_writing(sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ledger_check.FAIL_EVERY_ENV, "3")
    assert write(6) == ["ok", "ok", "failed", "ok", "ok", "failed"]
    rows = ledger_check.committed_rows(sink)
    assert len(rows) == 4 and {row["data"] for row in rows} == {"k:1"}


def test_the_sink_hangs_after_n_written_batches(sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ledger_check.HANG_AFTER_ENV, "2")
    assert write(2) == ["ok", "ok"]
    third = threading.Thread(target=write, args=(1,), daemon=True)
    third.start()
    third.join(0.5)
    try:
        assert third.is_alive(), "the third call returned"
        assert len(list(sink.glob("*.jsonl"))) == 2
    finally:
        ledger_check.hang_released.set()
        third.join(5)
        ledger_check.hang_released.clear()
    assert len(list(sink.glob("*.jsonl"))) == 3


def test_rows_name_the_process_that_committed_them(sink: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFO_WORKER_ID", "w7")
    write(1)
    (row,) = ledger_check.committed_rows(sink)
    assert (
        row["worker"] == "w7" and row["pid"] > 0 and row["committed_ns"] > 0 and row["batch"].endswith("run-00000001")
    )
