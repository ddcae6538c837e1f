"""The topics file: entries loaded one by one, each mistake located and contained, duplicates
refused, patterns resolved against Kafka's topic names."""

import json
import textwrap
from pathlib import Path

import pytest

from cairn.config import DEFAULT_ARCHIVE_ROOT, TopicConfig
from cairn.topics_file import LoadResult, find_topic, load_topics

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


def resolve(entries: list[TopicConfig], names: list[str]) -> LoadResult:
    return LoadResult(entries, [], []).resolve(names)


def test_resolve_expands_patterns_exact_entries_win_and_internal_topics_never_match():
    exact = TopicConfig(topic="orders.eu", format="raw", generation=7)
    orders = TopicConfig(pattern=r"orders\..*", format="raw", generation=2)
    logs = TopicConfig(pattern=r"logs|ordersX.*", format="raw", generation=3)
    never = TopicConfig(topic="planned.topic", format="raw")
    kafka = ["orders.us", "orders.eu", "ordersXus", "__consumer_offsets", "__orders.x", "logs"]
    resolved = resolve([exact, orders, logs, never], kafka)
    assert resolved.errors == []
    got = {t.topic: t.generation for t in resolved.topics}
    assert got == {"orders.eu": 7, "orders.us": 2, "logs": 3, "ordersXus": 3, "planned.topic": 1}
    assert [t.topic for t in resolved.topics] == sorted(got)
    assert all(t.pattern is None for t in resolved.topics)


def test_a_topic_two_patterns_match_loads_from_neither_and_the_error_names_both(tmp_path):
    """Not the first by file name: a new team's file must not take over an archived topic."""
    (tmp_path / "a.yaml").write_text("topics:\n  - {pattern: 'orders[.].+', format: raw}\n")
    (tmp_path / "b.yaml").write_text(
        "topics:\n  - {topic: orders.eu, format: raw}\n  - {pattern: '.+[.]us', format: raw}\n"
    )
    loaded = load_topics(tmp_path)
    assert loaded.errors == []

    resolved = loaded.resolve(["orders.us", "orders.eu", "orders.uk", "logs.us"])

    # the exact entry wins over both patterns; each pattern keeps its other topics
    assert [t.topic for t in resolved.topics] == ["logs.us", "orders.eu", "orders.uk"]
    (error,) = resolved.errors
    assert str(error) == (
        f"{tmp_path / 'a.yaml'}, line 2: topic 'orders.us': pattern: matched by pattern "
        f"'orders[.].+' ({tmp_path / 'a.yaml'}, line 2) and pattern '.+[.]us' "
        f"({tmp_path / 'b.yaml'}, line 3); archived by neither until one pattern matches it: "
        "narrow the patterns, or add an exact entry for the topic (it wins over patterns)"
    )
    assert resolved.files == loaded.files
    with pytest.raises(LookupError, match=r"topic 'orders.us': pattern: matched by pattern"):
        find_topic("orders.us", tmp_path)
    assert find_topic("orders.uk", tmp_path).written_at == f"{tmp_path / 'a.yaml'}, line 2"


def test_pattern_must_match_the_whole_name():
    resolved = resolve([TopicConfig(pattern="orders", format="raw")], ["orders", "orders2"])
    assert [t.topic for t in resolved.topics] == ["orders"]


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
    (resolved,) = load_topics(path).resolve(["events.a", "other"]).topics
    assert resolved.topic == "events.a" and resolved.user_schema == SCHEMA


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


def test_find_topic_reads_the_files_again_only_when_they_or_the_entrys_schemas_change(
    tmp_path, monkeypatch
):
    """The triggerer asks for every step of every run: reading 1,000 entries each time cost half
    a second, so one read serves every topic until a topics file or a file the entry names
    changes. Times are simulated: a file's modification time, and when each read began."""
    import os
    from types import SimpleNamespace

    from cairn import topics_file

    reads = []
    monkeypatch.setattr(topics_file, "load_topics", lambda p: reads.append(p) or load_topics(p))
    clock = [10**18]
    monkeypatch.setattr(topics_file, "time", SimpleNamespace(time_ns=lambda: clock[0]))
    second = 10**9

    def edited(file: Path, text: str | None = None) -> None:
        """`file` written now (`text`, or as it is), then the clock moves on 10 seconds."""
        if text is not None:
            file.write_text(text)
        os.utime(file, ns=(clock[0], clock[0]))
        clock[0] += 10 * second

    entry = "  - topic: {name}\n    format: json\n    schema: schemas/e.avsc\n"
    entry += "    event_time: {{field: ts, encoding: epoch_millis}}\n    max_time_lag: {lag}\n"
    text = "topics:\n" + entry.format(name="t", lag="1h") + entry.format(name="u", lag="1h")
    path = write(tmp_path, text)
    schema = tmp_path / "schemas" / "e.avsc"
    edited(path), edited(schema)
    first = find_topic("t", path)
    assert find_topic("t", path) is first and find_topic("u", path).topic == "u"
    assert len(reads) == 1  # one read for both topics

    edited(path, text.replace("1h", "90m"))  # the entries changed
    assert find_topic("t", path).max_time_lag.total_seconds() == 5400 and len(reads) == 2
    assert find_topic("u", path).max_time_lag.total_seconds() == 5400 and len(reads) == 2

    wider = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "id", "type": "string"}]}
    edited(schema, json.dumps(wider))  # their schema changed
    assert [f["name"] for f in find_topic("t", path).user_schema["fields"]] == ["ts", "id"]
    assert len(reads) == 3
    assert "id" in {f["name"] for f in find_topic("u", path).user_schema["fields"]}
    assert len(reads) == 3

    path.write_text(text)  # changed while the clock did not move: not trusted, read each time
    assert find_topic("t", path).max_time_lag.total_seconds() == 3600 and len(reads) == 4
    find_topic("t", path)
    assert len(reads) == 5

    schema.unlink()  # its schema is gone: an error, not the entry as it was
    with pytest.raises(LookupError, match=r"e\.avsc"):
        find_topic("t", path)
