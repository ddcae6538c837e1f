import json
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from cairn.config import (
    DEFAULT_ARCHIVE_ROOT,
    ArchiveRoot,
    TopicConfig,
    load_topics,
    parse_archive_root,
    resolve,
)
from cairn.schedule import spread

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "record", "name": "E", "fields": [{"name": "ts", "type": "long"}]}


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "e.avsc").write_text(json.dumps(SCHEMA))
    path = tmp_path / "topics.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def errors_by_entry(result) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for e in result.errors:
        found.setdefault(e.entry, []).append((e.field, e.message))
    return found


def test_repo_topics_file_loads_cleanly():
    result = load_topics(REPO / "include" / "topics.yaml")
    assert result.errors == []
    demo = next(t for t in result.topics if t.topic == "cairn.demo.events")
    assert demo.format == "json" and demo.user_schema["name"] == "DemoEvent"
    assert demo.schema_path == REPO / "include" / "schemas" / "demo_event.avsc"


def test_defaults_are_merged_and_documented_defaults_apply(tmp_path):
    path = write(
        tmp_path,
        """
        defaults:
          timezone: Europe/Berlin
          generation: 2
        topics:
          - topic: a
            format: raw
          - topic: b
            format: json
            schema: schemas/e.avsc
            event_time: {field: ts, encoding: epoch_millis}
            generation: 3
        """,
    )
    result = load_topics(path)
    assert result.errors == []
    a, b = result.topics
    assert (a.timezone, a.generation, b.generation) == ("Europe/Berlin", 2, 3)
    assert a.path_format == "dt=%Y-%m-%d/hr=%H"
    assert a.codec == "deflate" and a.schedule == "*/10 * * * *"
    assert a.max_records_per_partition == 500_000 and a.new_partition_start == "earliest"
    assert a.accept_gaps is False and a.time_source == "event"
    assert a.archive_root == DEFAULT_ARCHIVE_ROOT == f"file://{REPO}/.cairn/archive"
    assert b.user_schema == SCHEMA and b.schema_path == tmp_path / "schemas" / "e.avsc"


def test_bad_entries_are_reported_with_file_line_topic_and_field_while_good_ones_load(tmp_path):
    path = write(
        tmp_path,
        """
        topics:
          - topic: good
            format: raw
          - topic: typo
            format: raw
            shedule: "@hourly"
          - topic: badenc
            format: json
            schema: schemas/e.avsc
            event_time: {field: ts, encoding: epoch_nanos}
          - topic: noschema
            format: json
            time_source: processing
          - topic: noevent
            format: json
            schema: schemas/e.avsc
          - topic: missingfile
            format: json
            schema: schemas/nope.avsc
            time_source: processing
          - pattern: "orders(["
            format: raw
          - topic: tz
            format: raw
            timezone: Mars/Olympus
            generation: 0
          - topic: cron
            format: raw
            schedule: "every minute"
          - topic: root
            format: raw
            archive_root: s3://bucket/prefix
          - topic: fmt
            format: raw
            path_format: "%Y/%m/%d"
          - topic: "bad/name"
            format: raw
          - topic: both
            pattern: "b.*"
            format: raw
          - format: raw
          - 42
          - topic: good
            format: raw
          - topic: also-good
            format: raw
        """,
    )
    result = load_topics(path)
    assert [t.topic for t in result.topics] == ["also-good"]
    errors = errors_by_entry(result)
    assert errors["topic 'typo'"] == [("shedule", "Extra inputs are not permitted")]
    assert errors["topic 'badenc'"][0][0] == "event_time.encoding"
    assert errors["topic 'noschema'"][0][0] == "schema"
    assert errors["topic 'noevent'"][0][0] == "event_time"
    assert errors["topic 'missingfile'"][0][0] == "schema"
    assert "nope.avsc" in errors["topic 'missingfile'"][0][1]
    assert errors["pattern 'orders(['"][0][0] == "pattern"
    assert {f for f, _ in errors["topic 'tz'"]} == {"timezone", "generation"}
    assert errors["topic 'cron'"][0][0] == "schedule"
    assert errors["topic 'root'"][0] == (
        "archive_root",
        "archive root 's3://bucket/prefix': name the Airflow connection, "
        "s3://<conn_id>@<bucket>/<prefix>",
    )
    assert errors["topic 'fmt'"][0][0] == "path_format"
    assert errors["topic 'bad/name'"][0][0] == "topic"
    assert errors["topic 'both'"][0][0] == "topic"
    assert errors["entry #14"][0][0] == "topic"
    assert errors["entry #15"] == [("", "entry must be a mapping")]
    assert errors["topic 'good'"] == [  # written twice: neither copy loads
        ("", f"also defined at {path}, line 44; neither is loaded until one is removed"),
        ("", f"also defined at {path}, line 3; neither is loaded until one is removed"),
    ]
    (typo,) = [e for e in result.errors if e.entry == "topic 'typo'"]
    assert str(typo) == f"{path}, line 7: topic 'typo': shedule: Extra inputs are not permitted"
    assert {e.file for e in result.errors} == {str(path)}
    assert [e.line for e in result.errors if e.entry == "topic 'badenc'"] == [11]


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


def test_file_level_problems(tmp_path):
    path = write(
        tmp_path,
        """
        defaults: [1]
        topic: x
        topics:
          - topic: ok
            format: raw
        """,
    )
    result = load_topics(path)
    assert [t.topic for t in result.topics] == ["ok"]
    assert {(e.entry, e.field, e.line) for e in result.errors} == {
        ("file", "topic", 3),
        ("defaults", "", 2),
    }


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


def test_resolve_expands_patterns_exact_entries_win_and_internal_topics_never_match():
    exact = TopicConfig(topic="orders.eu", format="raw", generation=7)
    first = TopicConfig(pattern=r"orders\..*", format="raw", generation=2)
    second = TopicConfig(pattern=r".*", format="raw", generation=3)
    never = TopicConfig(topic="planned.topic", format="raw")
    kafka = ["orders.us", "orders.eu", "ordersXus", "__consumer_offsets", "__orders.x", "logs"]
    resolved = resolve([exact, first, second, never], kafka)
    got = {t.topic: t.generation for t in resolved}
    assert got == {"orders.eu": 7, "orders.us": 2, "logs": 3, "ordersXus": 3, "planned.topic": 1}
    assert [t.topic for t in resolved] == sorted(got)
    assert all(t.pattern is None for t in resolved)
    # among patterns, the first listed wins
    assert {t.topic: t.generation for t in resolve([second, first], ["orders.us"])} == {
        "orders.us": 3
    }


def test_pattern_must_match_the_whole_name():
    resolved = resolve([TopicConfig(pattern="orders", format="raw")], ["orders", "orders2"])
    assert [t.topic for t in resolved] == ["orders"]


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


def test_resolved_pattern_topics_keep_their_schema(tmp_path):
    path = write(
        tmp_path,
        """
        topics:
          - pattern: 'events[.].+'
            format: json
            schema: schemas/e.avsc
            event_time: {field: ts, encoding: epoch_millis}
        """,
    )
    (resolved,) = resolve(load_topics(path).topics, ["events.a", "other"])
    assert resolved.topic == "events.a" and resolved.user_schema == SCHEMA


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


def test_a_folder_of_topics_files_loads_each_file_alone(tmp_path):
    """conf.d: every *.yaml/*.yml file in name order, each with its own defaults and schema
    folder; a file that is not YAML loses only its own entries, named by file and line."""
    folder = tmp_path / "topics.d"
    folder.mkdir()
    write(folder, "defaults: {timezone: Europe/Berlin}\ntopics:\n  - {topic: a, format: raw}\n")
    (folder / "topics.yaml").rename(folder / "team-a.yaml")
    (folder / "team-b.yaml").write_text("topics:\n  - topic: b\n    format: raw\n   seal: x\n")
    (folder / "team-c.yml").write_text(
        "topics:\n  - topic: c\n    format: json\n    schema: schemas/e.avsc\n"
        "    time_source: processing\n"
    )
    (folder / ".team-d.yaml").write_text("topics: [")  # an editor's file, not read
    (folder / "README.txt").write_text("topics: [")
    (folder / "old").mkdir()
    (folder / "old" / "x.yaml").write_text("topics: [")

    result = load_topics(folder)

    assert result.files == [folder / "team-a.yaml", folder / "team-b.yaml", folder / "team-c.yml"]
    loaded = {t.topic: t for t in result.topics}
    assert sorted(loaded) == ["a", "c"]
    assert loaded["a"].timezone == "Europe/Berlin" and loaded["c"].timezone == "UTC"
    assert loaded["c"].schema_path == folder / "schemas" / "e.avsc"
    (broken,) = result.errors
    assert str(broken) == (
        f"{folder / 'team-b.yaml'}, line 4: not valid YAML at column 4: expected <block end>, "
        "but found '<block mapping start>'; fix the file there"
    )


def test_a_topic_in_two_files_loads_from_neither(tmp_path):
    """Even when one copy is invalid: it may be the one meant, so the other does not win."""
    (tmp_path / "a.yaml").write_text("topics:\n  - {topic: t, format: raw}\n")
    (tmp_path / "b.yaml").write_text(
        "topics:\n  - {topic: u, format: raw}\n  - {topic: t, format: json}\n"
    )
    result = load_topics(tmp_path)
    assert [t.topic for t in result.topics] == ["u"]
    assert [str(e) for e in result.errors] == [
        f"{tmp_path / 'a.yaml'}, line 2: topic 't': also defined at {tmp_path / 'b.yaml'}, "
        "line 3; neither is loaded until one is removed",
        f"{tmp_path / 'b.yaml'}, line 3: topic 't': schema: json topics need an Avro schema "
        "(.avsc)",
        f"{tmp_path / 'b.yaml'}, line 3: topic 't': also defined at {tmp_path / 'a.yaml'}, "
        "line 2; neither is loaded until one is removed",
    ]


def test_a_missing_topics_path_is_a_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        load_topics(tmp_path / "nope.yaml")
    assert raised.value.filename == str(tmp_path / "nope.yaml")


def test_a_bad_value_from_defaults_is_named_at_its_line_in_defaults(tmp_path):
    path = write(
        tmp_path,
        """
        defaults:
          schedule: every minute
        topics:
          - topic: a
            format: raw
          - topic: b
            format: raw
            schedule: "@hourly"
        """,
    )
    result = load_topics(path)
    assert [t.topic for t in result.topics] == ["b"]
    (error,) = result.errors
    assert (error.entry, error.field, error.line) == ("topic 'a'", "schedule", 3)
