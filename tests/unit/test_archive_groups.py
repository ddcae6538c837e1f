"""Which runs of a shared archive job one Kafka source reads (`spark_jobs.archive._groups`)."""

from __future__ import annotations

from types import SimpleNamespace

from cairn.config import INCLUDE_DIR, TopicConfig
from cairn.jobs import ArchiveInput
from spark_jobs.archive import Part, _groups, archive, new_nonce

SCHEMA = str(INCLUDE_DIR / "schemas" / "demo_event.avsc")


def part(topic: str, kafka: str = "k:9092", **entry: object) -> Part:
    cfg = TopicConfig.model_validate(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "archive_root": "file:///a",
            "event_time": {"field": "ts", "encoding": "iso8601"},
            **entry,
        }
    )
    job = ArchiveInput(
        topic=cfg.snapshot(), claim="c", kafka={"bootstrap.servers": kafka}, kafka_label="k"
    )
    return Part(job, cfg, None, SimpleNamespace(topic=topic))  # type: ignore[arg-type]


def test_like_topics_share_a_source_and_a_topics_second_run_or_another_config_does_not():
    """(A timezone is Python's concern, not the projection's: it shares a source.)"""
    parts = dict(
        enumerate(
            [
                part("a"),
                part("b"),
                part("by_id", event_time={"field": "id", "encoding": "iso8601"}),
                part("a"),  # a second attempt of `a` (one fenced out by the other)
                part("c", timezone="Asia/Tokyo"),
                part("elsewhere", kafka="other:9092"),
            ]
        )
    )

    assert _groups(parts, new_nonce()) == [[0, 1, 4], [2], [3], [5]]


def test_a_job_whose_every_run_fails_its_check_returns_their_errors_and_starts_no_spark(tmp_path):
    """(All runs fenced out: no Spark work, and no job to tag.)"""
    spark = SimpleNamespace(conf=SimpleNamespace(set=lambda key, value: None))
    jobs = [part(topic, archive_root=tmp_path.as_uri()).job for topic in ("a", "b")]

    unclaimed = [job.model_copy(update={"claim": "_claims/a/x.json"}) for job in jobs]
    outcomes = archive(spark, unclaimed, "t")  # type: ignore[arg-type]

    assert len(outcomes) == 2 and all(isinstance(o, Exception) for o in outcomes), outcomes
