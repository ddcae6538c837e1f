"""Retention gaps, offsets ahead of Kafka, and the tokens CLI (list, rewind, refusal)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cairn.cli import main as cli
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import run_record
from cairn.protocol import commit, manifest, tokens
from cairn.protocol.plan import RetentionGap, TopicRecreated
from cairn_stack.demo import create_topic, produce
from tests.integration.conftest import coords, read_archive
from tests.integration.test_archive import NOW, event


def delete_records(kafka: str, topic: str, before: int) -> None:
    """Kafka's admin delete-records: what retention does, but deterministic."""
    admin = AdminClient({"bootstrap.servers": kafka})
    (future,) = admin.delete_records([TopicPartition(topic, 0, before)]).values()
    future.result(30)


def recreate_topic(kafka: str, topic: str) -> None:
    """Delete `topic` and create it again under the same name (with one partition)."""
    delete_topic(kafka, topic)
    for _ in range(100):  # the controller may still be removing its partitions
        try:
            create_topic(kafka, topic, partitions=1)
            return
        except KafkaException:
            time.sleep(0.2)
    raise TimeoutError(f"could not recreate {topic}")


def delete_topic(kafka: str, topic: str) -> None:
    """Delete `topic` and wait until the cluster no longer lists it."""
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.delete_topics([topic])[topic].result(30)
    for _ in range(100):  # deletion completes asynchronously
        if topic not in admin.list_topics(timeout=10).topics:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic} still listed after deletion")


@pytest.fixture
def archived_twice(kafka, archiver, make_cfg, topic_name):
    """A one-partition topic archived by two runs: token 1 at offset 5, token 2 at 20."""
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    archiver.run(cfg)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5, 20)], partition=0)
    archiver.run(cfg)
    return cfg


def test_records_deleted_before_archiving_fail_the_run_naming_the_range(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    cfg = make_cfg(topic_name)
    archiver.run(cfg)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5, 20)], partition=0)
    delete_records(kafka, topic_name, before=12)
    storage = archiver.storage(cfg)
    before = storage.list()

    with pytest.raises(RetentionGap, match=rf"{topic_name}.*partition 0.*\[5, 12\)"):
        archiver.run(cfg)
    assert storage.list() == before  # failed before writing anything

    accepting = make_cfg(topic_name, "accept_gaps: true\n")
    summary = archiver.run(accepting)

    assert summary.ranges == {0: (12, 20)}
    gap = {"partition": 0, "from_offset": 5, "to_offset": 12}
    newest = commit.newest(storage, topic_name)
    assert [g.model_dump() for g in newest.gaps] == [gap]
    assert [g.model_dump() for g in manifest.load(storage, newest.manifest).gaps] == [gap]
    offsets = coords(read_archive(storage, topic_name).backup)
    assert offsets == [(0, o) for o in [*range(5), *range(12, 20)]]


def test_a_recreated_topic_with_fewer_records_is_named_as_recreated(
    kafka, archiver, archived_twice, topic_name
) -> None:
    recreate_topic(kafka, topic_name)
    produce(kafka, topic_name, [event(0, NOW)], partition=0)

    with pytest.raises(TopicRecreated, match="deleted and recreated"):
        archiver.run(archived_twice)


def test_cli_lists_and_rewinds_tokens(
    kafka, archiver, archived_twice, topic_name, tmp_path, capsys
) -> None:
    topics = str(tmp_path / f"{topic_name}.yaml")

    assert cli(["--topics-file", topics, "tokens", "list", topic_name]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listing] == ["1", "2"]
    assert '{"0": 20}' in listing[1]

    args = ["--topics-file", topics, "tokens", "rewind", topic_name, "--bootstrap-servers", kafka]
    assert cli([*args, "--count", "1"]) == 0
    assert "consumer group cairn." in capsys.readouterr().out
    storage = archiver.storage(archived_twice)
    assert [t.seq for t in tokens.list_tokens(storage, topic_name)] == [1]
    # The group follows the tokens back: the triggerer of a run_on: records topic sees the
    # rewound records waiting, as lag tools do.
    conf = KafkaConf({"bootstrap.servers": kafka}, "test")
    group = archived_twice.group_id
    assert cluster.group_offsets(conf, group, topic_name, [0]) == {0: 5}
    (first_read,) = run_record.load(storage, topic_name, 2).freshness[-1:]
    assert first_read.records == 15  # a first read counts for freshness...
    summary = archiver.run(archived_twice)
    assert summary.ranges == {0: (5, 20)}
    assert summary.freshness == []  # ... a re-read does not: its wait is the rewind's
    assert cluster.group_offsets(conf, group, topic_name, [0]) == {0: 20}
    assert coords(read_archive(storage, topic_name).backup) == [(0, o) for o in range(20)]


def test_rewind_past_retention_is_refused_and_deletes_nothing(
    kafka, archiver, archived_twice, topic_name, tmp_path, capsys
) -> None:
    delete_records(kafka, topic_name, before=10)
    storage = archiver.storage(archived_twice)
    before = storage.list()
    topics = str(tmp_path / f"{topic_name}.yaml")
    args = ["--topics-file", topics, "tokens", "rewind", topic_name, "--bootstrap-servers", kafka]

    assert cli([*args, "--count", "1"]) == 1

    error = capsys.readouterr().err
    assert "partition 0 [5, 20)" in error and "retention" in error and "rebuild" in error
    assert storage.list() == before


def test_a_topic_deleted_under_a_run_is_never_created_again_by_cairn(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """The stack's broker creates a topic any client asks for (`auto.create.topics.enable`,
    Kafka's default): none of Cairn's clients may ask, or a deleted topic would come back empty
    and be archived as a new one. Plan, the Spark job and commit each meet the deleted topic."""
    create_topic(kafka, topic_name, partitions=1)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    cfg = make_cfg(topic_name)
    planned = archiver.plan(cfg)
    assert planned is not None
    delete_topic(kafka, topic_name)

    conf = KafkaConf.from_bootstrap(kafka, "the test broker")
    with pytest.raises(cluster.TopicNotFound, match=topic_name):
        archiver.plan(cfg)
    with pytest.raises(RuntimeError, match=f"a topic of the job gone .*'{topic_name}'"):
        archiver.write(cfg, planned)
    with pytest.raises(cluster.TopicNotFound, match=topic_name):  # commit's check
        cluster.fetch_topic_id(conf, topic_name)
    with pytest.raises(KafkaException, match=topic_name):  # completeness's question
        cluster.offsets_after(conf, topic_name, [0], 0)

    time.sleep(3)  # an auto-creation the broker was asked for completes within this
    assert topic_name not in cluster.list_topic_names(conf)
    assert commit.newest(archiver.storage(cfg), topic_name) is None
