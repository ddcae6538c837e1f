"""Operating Cairn against the real Kafka and Spark: each commit leaves a status record with the
run's numbers and lag, and gives the topic's consumer group the token's offsets, so Kafka's own
lag tools see Cairn like any consumer; a group Kafka refuses to update never undoes a commit."""

from __future__ import annotations

import time
from datetime import timedelta

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from cairn.pipeline import archive_run, run_record
from cairn.protocol import commit
from cairn.views import metrics
from cairn_stack.demo import create_topic, produce
from tests.integration.test_archive import NOW, fill


def group_offsets(kafka: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """What `kafka-consumer-groups --describe` reads: the group's committed offsets."""
    admin = AdminClient({"bootstrap.servers": kafka})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(partitions)]
    )
    (future,) = admin.list_consumer_group_offsets([request]).values()
    return {tp.partition: tp.offset for tp in future.result(30).topic_partitions}


def test_each_commit_records_its_status_and_the_consumer_groups_offsets(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=8)
    produce(kafka, topic_name, [b"not json"], partition=0)  # offset 8: quarantined
    cfg = make_cfg(topic_name, "max_records_per_partition: 5\n")
    storage = archiver.storage(cfg)

    first = archiver.run(cfg)

    assert first.consumer_group == f"cairn.{topic_name}" and first.consumer_group_error is None
    assert group_offsets(kafka, first.consumer_group, topic_name, 2) == {0: 5, 1: 5}
    (record,) = run_record.recent(storage, topic_name)
    assert (record.seq, record.counts.read, record.counts.quarantined) == (1, 10, 0)
    assert record.offset_lag == {0: 4, 1: 3} and record.next_offsets == {0: 5, 1: 5}
    assert record.time_lag_seconds > 0 and record.partition_time_lag_seconds[0] > 0
    token = commit.newest(storage, topic_name)
    assert record.committed_at == token.created_at and record.run_id == token.run_id
    assert record.counts.bytes == token.counts.bytes > 0
    assert record.duration_seconds == (token.created_at - token.planned_at).total_seconds()

    archiver.run(cfg)  # reads the rest, the bad record among it

    assert group_offsets(kafka, first.consumer_group, topic_name, 2) == {0: 9, 1: 8}
    newest = run_record.topic_status(storage, topic_name)
    assert [r.seq for r in newest.recent] == [2, 1]
    assert newest.last.offset_lag == {0: 0, 1: 0} and newest.last.time_lag_seconds == 0
    assert (newest.last.counts.read, newest.last.counts.quarantined) == (7, 1)
    assert newest.quarantine_ratio == 1 / 17
    served = {(s.name, s.labels.get("partition")): s.value for s in metrics.samples(newest)}
    assert served[(metrics.RECORDS_ARCHIVED, "0")] == 9
    assert served[(metrics.RECORDS_QUARANTINED, "0")] == 1
    assert served[(metrics.OFFSET_LAG, "1")] == 0


def test_a_group_kafka_refuses_to_update_leaves_the_commit_standing(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=4)
    group = f"busy-{topic_name}"
    cfg = make_cfg(topic_name, f"consumer_group: {group}\n")
    member = Consumer({"bootstrap.servers": kafka, "group.id": group})
    member.subscribe([topic_name])
    try:
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.5)  # an active member: Kafka refuses offsets from outside the group
        summary = archiver.run(cfg)
    finally:
        member.close()

    assert summary.consumer_group is None and group in summary.consumer_group_error
    storage = archiver.storage(cfg)
    assert commit.newest(storage, topic_name).next_offsets == {0: 4}
    assert run_record.recent(storage, topic_name)[0].consumer_group_error is not None


def test_a_topic_can_keep_its_consumer_group_untouched(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=3)
    cfg = make_cfg(topic_name, "commit_consumer_group: false\n")

    summary = archiver.run(cfg)

    assert summary.consumer_group is None and summary.consumer_group_error is None
    assert group_offsets(kafka, cfg.group_id, topic_name, 1) == {0: -1001}


def test_a_late_retry_of_an_older_commit_does_not_move_the_group_back(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=6)
    cfg = make_cfg(topic_name, "max_records_per_partition: 3\n")
    storage = archiver.storage(cfg)
    first = archiver.plan(cfg)
    archiver.write(cfg, first)
    report = archive_run.verify_run(storage, first)
    archive_run.commit_run(cfg, storage, first, report, archiver.kafka)
    archiver.run(cfg)

    again = archive_run.commit_run(cfg, storage, first, report, archiver.kafka)  # retried late

    assert again.seq == 1 and again.consumer_group is None
    assert group_offsets(kafka, cfg.group_id, topic_name, 1) == {0: 6}


def test_a_rebuild_committed_before_the_group_moves_does_not_keep_it_back(
    kafka, archiver, make_cfg, topic_name
) -> None:
    # A seal or rebuild token between a run's token and its group update carries the position
    # over: the group must still move, or the triggerer waits for a commit that happened.
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=3)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    planned = archiver.plan(cfg)
    archiver.write(cfg, planned)
    report = archive_run.verify_run(storage, planned)
    token = archive_run.commit_archive(cfg, storage, planned, report, archiver.kafka)
    assert token.seq == 1
    days = (NOW - timedelta(days=1)).date(), NOW.date()  # fill spreads 3 records over 14 h
    assert archiver.rebuild(cfg, *days) is not None  # token 2: the position carried over

    record = archive_run.commit_run(cfg, storage, planned, report, archiver.kafka)  # retried

    assert record.seq == 1 and record.consumer_group == cfg.group_id
    assert group_offsets(kafka, cfg.group_id, topic_name, 1) == {0: 3}
