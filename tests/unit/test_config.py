"""The topic configuration model: what each field accepts and refuses."""

import json
from datetime import timedelta

import pytest

from cairn.config import ArchiveRoot, TopicConfig, parse_archive_root
from cairn.schedule import spread
from cairn.topics_file import load_topics
from tests.unit.test_topics_file import errors_by_entry, write


def test_raw_topics_refuse_parser_settings(tmp_path):
    path = write(
        tmp_path,
        """
        topics:
          - topic: r
            format: raw
            schema: schemas/e.avsc
        """,
    )
    assert errors_by_entry(load_topics(path))["topic 'r'"][0][0] == "schema"


def test_schema_using_reserved_coordinate_names_is_an_entry_error(tmp_path):
    path = write(
        tmp_path,
        """
        topics:
          - topic: c
            format: json
            schema: schemas/clash.avsc
            time_source: processing
        """,
    )
    clash = {"type": "record", "name": "C", "fields": [{"name": "_kafka_offset", "type": "long"}]}
    (tmp_path / "schemas" / "clash.avsc").write_text(json.dumps(clash))
    field, message = errors_by_entry(load_topics(path))["topic 'c'"][0]
    assert field == "schema" and "_kafka_offset" in message


@pytest.mark.parametrize("schedule", ["@hourly", "@daily", "0 * * * *", "*/5 1-3 * * mon-fri"])
def test_valid_schedules(schedule):
    assert TopicConfig(topic="t", format="raw", schedule=schedule).schedule == schedule


@pytest.mark.parametrize("schedule", ["@once", "* * *", "*/10 * * * * *", "61 * * * *", ""])
def test_invalid_schedules(schedule):
    with pytest.raises(ValueError):
        TopicConfig(topic="t", format="raw", schedule=schedule)


def test_config_survives_a_json_round_trip():
    """The DAG hands configs to the Spark job as JSON."""
    cfg = TopicConfig.model_validate(
        {"topic": "t", "format": "json", "schema": "s.avsc", "time_source": "processing"}
    )
    assert TopicConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize(
    "url, expected",
    [
        ("file:///data/archive", ArchiveRoot("file", None, None, "/data/archive")),
        ("file:///data/archive/", ArchiveRoot("file", None, None, "/data/archive")),
        (
            "s3://cairn_s3@my-bucket/kafka/raw",
            ArchiveRoot("s3", "cairn_s3", "my-bucket", "kafka/raw"),
        ),
        (
            "s3://aws_default@bucket.with.dots",
            ArchiveRoot("s3", "aws_default", "bucket.with.dots", ""),
        ),
    ],
)
def test_parse_archive_root(url, expected):
    assert parse_archive_root(url) == expected


def test_archive_root_storage_url():
    assert parse_archive_root("s3://c@bkt/a/b").storage_url == "s3://bkt/a/b"
    assert parse_archive_root("s3://c@bkt").storage_url == "s3://bkt"
    assert parse_archive_root("file:///x/y").storage_url == "file:///x/y"


@pytest.mark.parametrize(
    "url",
    [
        "file://relative/path",
        "file:relative",
        "file:///",
        "file:///data/../etc",
        "/data/archive",
        "s3://bucket/prefix",
        "s3://@bucket/prefix",
        "s3://conn:secret@bucket/prefix",
        "s3://conn@Bad_Bucket/x",
        "s3://conn@bucket/a/../b",
        "s3://conn@bucket/x?versionId=1",
        "gs://conn@bucket/x",
        "https://example.com/x",
    ],
)
def test_parse_archive_root_rejects(url):
    with pytest.raises(ValueError, match="archive root"):
        parse_archive_root(url)


def test_a_topic_too_long_for_its_dag_ids_is_an_entry_error(tmp_path):
    path = tmp_path / "topics.yaml"
    path.write_text(f"topics:\n  - topic: {'t' * 242}\n    format: raw\n")
    (error,) = load_topics(path).errors
    assert error.field == "topic" and "at most 241 characters" in error.message


def test_archive_schedule_is_spread_by_topic_unless_turned_off(tmp_path):
    path = write(
        tmp_path,
        """
        topics:
          - topic: spread.me
            format: raw
          - topic: keep.me
            format: raw
            spread_schedule: false
          - topic: hourly
            format: raw
            schedule: "@hourly"
        """,
    )
    loaded = {t.topic: t for t in load_topics(path).topics}
    spread_me, keep_me, hourly = loaded["spread.me"], loaded["keep.me"], loaded["hourly"]
    assert spread_me.spread_schedule is True  # on by default
    assert spread_me.schedule == "*/10 * * * *"  # as written; only the DAG's schedule moves
    assert spread_me.archive_schedule == spread("*/10 * * * *", "spread.me") != spread_me.schedule
    assert keep_me.archive_schedule == "*/10 * * * *"
    assert hourly.archive_schedule == spread("@hourly", "hourly")
    pattern = TopicConfig(pattern="orders\\..+", format="raw")
    assert pattern.archive_schedule == pattern.schedule  # a pattern is not a topic yet


def test_spark_timeout_defaults_to_30_minutes_and_reads_durations(tmp_path):
    assert TopicConfig(topic="t", format="raw").spark_timeout == timedelta(minutes=30)
    assert TopicConfig(topic="t", format="raw", spark_timeout="2h").spark_timeout == timedelta(
        hours=2
    )
    assert TopicConfig(topic="t", format="raw", spark_timeout=900).spark_timeout == timedelta(
        minutes=15
    )
    path = write(
        tmp_path,
        """
        topics:
          - topic: too.short
            format: raw
            spark_timeout: 30s
          - topic: not.a.duration
            format: raw
            spark_timeout: soon
        """,
    )
    result = load_topics(path)
    assert result.topics == []
    found = errors_by_entry(result)
    ((field, message),) = found["topic 'too.short'"]
    assert field == "spark_timeout" and "at least 1m" in message
    ((field, message),) = found["topic 'not.a.duration'"]
    assert field == "spark_timeout" and "not a duration" in message


def test_an_event_time_encoding_that_cannot_read_the_schema_field_is_refused(tmp_path):
    schema = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "ts", "type": "long"},
            {"name": "at", "type": ["null", "string"], "default": None},
            {"name": "meta", "type": {"type": "record", "name": "M", "fields": [
                {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                {"name": "flag", "type": "boolean"},
            ]}},
        ],
    }  # fmt: skip
    (tmp_path / "e.avsc").write_text(json.dumps(schema))
    entries = [
        ("json", "ts", "iso8601"),
        ("json", "at", "epoch_millis"),
        ("json", "meta.flag", "epoch_seconds"),
        ("avro", "ts", None),
        ("avro", "meta.when", "iso8601"),  # fits: decoded to a datetime
        ("avro", "missing", "epoch_millis"),
        ("json", "missing", "epoch_millis"),  # fits: JSON reads it from the object itself
        ("json", "ts", "epoch_seconds"),
    ]
    topics = [
        {"topic": f"t{i}", "format": fmt, "schema": "e.avsc"}
        | {"event_time": {"field": field, "encoding": encoding}}
        | ({"avro": {"framing": "plain", "writer_schema": "e.avsc"}} if fmt == "avro" else {})
        for i, (fmt, field, encoding) in enumerate(entries)
    ]
    path = tmp_path / "topics.yaml"
    path.write_text(json.dumps({"topics": topics}))
    result = load_topics(path)
    assert [c.topic for c in result.topics] == ["t4", "t6", "t7"]
    quarantined = "every record would be quarantined"
    assert errors_by_entry(result) == {
        "topic 't0'": [
            (
                "event_time.encoding",
                "encoding iso8601 cannot read field 'ts', whose schema type is long: "
                f"{quarantined}; encodings that fit: epoch_seconds, epoch_millis",
            )
        ],
        "topic 't1'": [
            (
                "event_time.encoding",
                "encoding epoch_millis cannot read field 'at', whose schema type is "
                f'["null","string"]: {quarantined}; encodings that fit: iso8601',
            )
        ],
        "topic 't2'": [
            (
                "event_time.encoding",
                "encoding epoch_seconds cannot read field 'meta.flag', whose schema type is "
                f"boolean: {quarantined}; no encoding fits it",
            )
        ],
        "topic 't3'": [
            (
                "event_time.encoding",
                "an event time without encoding cannot read field 'ts', whose schema type is "
                f"long: {quarantined}; encodings that fit: epoch_seconds, epoch_millis",
            )
        ],
        "topic 't5'": [("event_time.field", "'missing' is not a field of the schema")],
    }
