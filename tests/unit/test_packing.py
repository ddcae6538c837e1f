"""`cairn.packing`: which ranges a shared job's Spark tasks read together, and a packed task's
records separated again per topic-partition."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cairn.packing import SMALL, TASK_RANGES, TASK_RECORDS, Source, pack, partition_runs


def test_tiny_ranges_of_many_topics_are_packed_into_few_tasks() -> None:
    ranges = {f"t{i}": {0: (100, 120), 1: (0, 20)} for i in range(1000)}

    (source,) = pack(ranges)

    assert source.ranges == ranges
    assert source.tasks == 2000 // TASK_RANGES  # 40 tasks instead of 2,000


def test_a_large_range_is_read_by_a_task_of_its_own() -> None:
    ranges = {"busy": {0: (0, SMALL), 1: (5, 25)}, "quiet": {0: (7, 8), 3: (9, 9)}}

    small, large = pack(ranges)

    assert large == Source({"busy": {0: (0, SMALL)}}, None)
    assert small == Source({"busy": {1: (5, 25)}, "quiet": {0: (7, 8)}}, 1)  # (9, 9) is empty


def test_packed_tasks_also_hold_at_most_about_task_records() -> None:
    ranges = {f"t{i}": {0: (0, SMALL - 1)} for i in range(30)}

    (source,) = pack(ranges)

    assert source.tasks == -(-30 * (SMALL - 1) // TASK_RECORDS)  # 3: ~100,000 records each


def test_nothing_to_pack_is_left_to_spark() -> None:
    assert pack({"t": {0: (3, 3)}}) == []
    assert pack({"t": {0: (0, 5)}}) == [Source({"t": {0: (0, 5)}}, None)]  # one task already


def batch(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    topics, partitions, offsets = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array(topics, pa.string()),
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
        }
    )


def runs_of(batches: list[pa.RecordBatch]) -> list[tuple[tuple[str, int], list[int]]]:
    return [
        (key, [o for b in run for o in b.column("offset").to_pylist()])
        for key, run in partition_runs(batches)
    ]


def test_a_packed_task_records_come_apart_per_topic_partition_where_batches_span_two() -> None:
    batches = [
        batch([("a", 0, 5), ("a", 0, 6), ("a", 1, 0)]),
        batch([]),
        batch([("a", 1, 1), ("b", 0, 9), ("b", 1, 3), ("b", 1, 4)]),
        batch([("b", 1, 5)]),
    ]

    assert runs_of(batches) == [
        (("a", 0), [5, 6]),
        (("a", 1), [0, 1]),
        (("b", 0), [9]),
        (("b", 1), [3, 4, 5]),
    ]
    assert runs_of([batch([("a", 0, 1)])]) == [(("a", 0), [1])]
    assert runs_of([batch([])]) == []


def test_a_topic_partition_met_again_after_another_is_refused() -> None:
    batches = [batch([("a", 0, 5), ("b", 0, 1), ("a", 0, 6)])]

    with pytest.raises(ValueError, match="a partition 0: its records came in two runs"):
        runs_of(batches)
