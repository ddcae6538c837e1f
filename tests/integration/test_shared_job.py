"""Archive runs that share one Spark job (`spark_jobs.archive.archive`,
`cairn_airflow.triggers.shared_archive`): each run keeps its own attempt, manifest and token;
a fenced-out run fails alone; a job one topic's records fail fails as a whole, and each run
alone then stages or fails by itself. Through the real Airflow, triggerer and Spark Connect: a
burst on several topics is archived by fewer Spark jobs than runs, each topic exactly once."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from cairn.packing import SMALL
from cairn.pipeline import run_record
from cairn.protocol import commit, tokens
from cairn.protocol.manifest import Manifest
from cairn.storage.objects import Storage
from cairn_stack.demo import create_topic, produce, sample_events
from tests.conftest import E2E_BURST, E2E_PREFIX
from tests.integration.conftest import read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once

LOST = r"(?i)data loss|offset"
"""How Spark's Kafka source says records it was to read are gone."""


def filled(kafka: str, topic: str, partitions: int, count: int) -> None:
    create_topic(kafka, topic, partitions=partitions)
    for p in range(partitions):
        produce(kafka, topic, sample_events(count, NOW, seed=p), partition=p)


def test_runs_of_several_topics_share_a_job_and_a_fenced_run_fails_alone(
    kafka, archiver, make_cfg, topic_name
) -> None:
    tokyo, json_, fenced = (f"{topic_name}-{k}" for k in ("tokyo", "json", "fenced"))
    for topic in (tokyo, json_, fenced):
        filled(kafka, topic, partitions=2, count=15)
    cfgs = {t: make_cfg(t) for t in (json_, fenced)}
    cfgs[tokyo] = make_cfg(tokyo, "timezone: Asia/Tokyo\n")  # its own layout in the same job
    planned = {topic: archiver.plan(cfg) for topic, cfg in cfgs.items()}
    storage = {topic: archiver.storage(cfg) for topic, cfg in cfgs.items()}
    again = archiver.plan(cfgs[fenced])  # fences the first attempt of `fenced` out
    assert again is not None

    outcomes = archiver.stage(*((cfgs[t], planned[t]) for t in (tokyo, fenced, json_)), tag="t1")

    done_tokyo, refused, done_json = outcomes
    assert isinstance(refused, commit.Fenced), refused
    assert isinstance(done_tokyo, Manifest) and isinstance(done_json, Manifest)
    assert done_tokyo.spark_job == done_json.spark_job and done_tokyo.spark_job.runs == 2
    for topic, manifest in ((tokyo, done_tokyo), (json_, done_json)):
        assert manifest.topic == topic and sum(manifest.records_read.values()) == 30
        record = archiver.finish(cfgs[topic], planned[topic])
        assert record.seq == 1 and record.spark_job.tag == "t1"  # each its own token
        assert_exactly_once(read_archive(storage[topic], topic), all_offsets({0: 15, 1: 15}))
    assert tokens.list_tokens(storage[fenced], fenced) == []  # nothing of the fenced attempt


def test_tiny_ranges_share_a_spark_task_and_a_large_one_has_its_own(
    kafka, archiver, make_cfg, topic_name
) -> None:
    tiny = [f"{topic_name}-tiny{i}" for i in range(5)]
    for topic in tiny:
        filled(kafka, topic, partitions=2, count=12)
    busy = f"{topic_name}-busy"  # one large range, one tiny
    create_topic(kafka, busy, partitions=2)
    produce(kafka, busy, sample_events(SMALL, NOW, seed=1), partition=0)
    produce(kafka, busy, sample_events(12, NOW, seed=2), partition=1)
    cfgs = {topic: make_cfg(topic) for topic in (*tiny, busy)}
    planned = {topic: archiver.plan(cfg) for topic, cfg in cfgs.items()}

    outcomes = archiver.stage(*((cfgs[t], planned[t]) for t in cfgs), tag="packed")

    assert all(isinstance(o, Manifest) for o in outcomes), outcomes
    # 11 tiny ranges read by one task, the large one by another: not one task per range
    assert {o.spark_job.tasks for o in outcomes} == {2}, outcomes[0].spark_job
    for topic, cfg in cfgs.items():
        archiver.finish(cfg, planned[topic])
        ends = {0: SMALL, 1: 12} if topic == busy else {0: 12, 1: 12}
        assert_exactly_once(read_archive(archiver.storage(cfg), topic), all_offsets(ends))


def test_a_topic_whose_records_fail_fails_the_shared_job_and_alone_only_itself(
    kafka, archiver, make_cfg, topic_name
) -> None:
    good, gone = f"{topic_name}-good", f"{topic_name}-gone"
    for topic in (good, gone):
        filled(kafka, topic, partitions=1, count=10)
    cfgs = {good: make_cfg(good), gone: make_cfg(gone)}
    planned = {topic: archiver.plan(cfg) for topic, cfg in cfgs.items()}
    # retention deletes records `gone`'s plan still has to read
    admin = AdminClient({"bootstrap.servers": kafka})
    (future,) = admin.delete_records([TopicPartition(gone, 0, 5)]).values()
    future.result(30)

    with pytest.raises(Exception, match=LOST):
        archiver.stage(*((cfgs[t], planned[t]) for t in (good, gone)))

    (alone,) = archiver.stage((cfgs[good], planned[good]))
    assert isinstance(alone, Manifest) and sum(alone.records_read.values()) == 10
    with pytest.raises(Exception, match=LOST):
        archiver.stage((cfgs[gone], planned[gone]))


def test_a_burst_on_several_topics_is_archived_by_fewer_spark_jobs_than_runs(
    airflow, kafka, s3, stack_settings
) -> None:
    for i, topic in enumerate(E2E_BURST):
        create_topic(kafka, topic, partitions=2)
        for p in range(2):
            produce(kafka, topic, sample_events(20, NOW, seed=10 * i + p), partition=p)
    dag_ids = [f"archive__{topic}" for topic in E2E_BURST]
    for dag_id in dag_ids:
        airflow.wait_for_dag(dag_id)

    for dag_id in dag_ids:
        airflow.trigger(dag_id)
    for dag_id in dag_ids:  # (unpausing may schedule a run too: its records are read once)
        runs = airflow.wait_for_runs(dag_id, timeout=900)
        assert all(r["state"] == "success" for r in runs), runs

    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    staged = []
    for topic in E2E_BURST:
        committed = tokens.list_tokens(storage, topic)  # each run its own token
        assert committed[-1].next_offsets == {0: 20, 1: 20}
        assert_exactly_once(read_archive(storage, topic), all_offsets({0: 20, 1: 20}))
        for token in committed:
            record = run_record.load(storage, topic, token.seq)
            assert record is not None
            if record.counts.read:
                assert record.spark_job is not None, record
                staged.append(record.spark_job)
                read_by, read_seq = (f"archive__{topic}", record.run_id), token.seq
    # fewer Spark jobs than runs that read records, and one of them served several topics
    assert len({job.tag for job in staged}) < len(staged), staged
    assert max(job.runs for job in staged) >= 2, staged
    # and the tiny ranges of a job were read by fewer Spark tasks than ranges (`cairn.packing`)
    assert all(job.tasks is not None and job.tasks < 2 * job.runs for job in staged), staged
    # the task deferred while Spark worked, and its log says which job staged it
    log = airflow.task_log(*read_by, "archive")
    assert "archive job shared on the Spark Connect server" in log, log
    # the steps around the job started and ended in the triggerer (no worker's hostname), and
    # their results reached the tasks downstream as they are; a step with nothing to do was
    # skipped there (no date to announce, no backlog to drain)
    tis = airflow.task_instances(*read_by)
    for step in ("plan", "clean", "verify", "commit", "complete", "check_health"):
        assert tis[step]["state"] == "success" and not tis[step]["hostname"], tis[step]
    for step in ("announce", "more_waiting", "drain_backlog"):
        assert tis[step]["state"] == "skipped" and not tis[step]["hostname"], tis[step]
    assert airflow.xcom(*read_by, "commit")["seq"] == read_seq
