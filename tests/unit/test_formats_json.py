"""The JSON format (`cairn.formats.json`): values in, schema records or quarantine reasons out;
and the parts every format shares (`cairn.formats.base`): event time, folders, output schema."""

import io
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pytest

from cairn.config import TopicConfig
from cairn.datafiles.avro_file import AvroFileWriter
from cairn.formats import open_format
from cairn.formats.base import KafkaCoords, Parsed, Quarantined, output_schema
from cairn.formats.json import MAX_DEPTH
from tests.unit.conftest import as_read

USER_SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "int"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "note", "type": ["null", "string"]},
        {
            "name": "meta",
            "type": {
                "type": "record",
                "name": "Meta",
                "fields": [{"name": "ts", "type": ["null", "long", "double", "string"]}],
            },
        },
    ],
}
SCHEMA_DIR = Path(tempfile.mkdtemp(prefix="cairn-test-json-"))
(SCHEMA_DIR / "s.avsc").write_text(json.dumps(USER_SCHEMA))
COORDS = KafkaCoords(partition=3, offset=41, timestamp=1_700_000_000_123)
NOW = datetime(2024, 6, 1, 12, 30, tzinfo=UTC)
TS_MS = 1_717_245_000_000  # 2024-06-01T12:30:00Z


def cfg(encoding: str = "epoch_millis", **extra) -> TopicConfig:
    base = {"topic": "t", "format": "json", "schema": "s.avsc"}
    if "time_source" not in extra:
        base["event_time"] = {"field": "meta.ts", "encoding": encoding}
    config = TopicConfig.model_validate(base | extra)
    config._base_dir = SCHEMA_DIR
    return config


def value(ts=TS_MS, **fields) -> bytes:
    return json.dumps({"id": "a", "n": 1, "note": None, "meta": {"ts": ts}} | fields).encode()


def parse(raw, config=None) -> Parsed | Quarantined:
    return open_format(config or cfg()).parse(raw, COORDS, NOW)


def reason(raw, config=None) -> str:
    result = parse(raw, config)
    assert isinstance(result, Quarantined), result
    assert len(result.reason) <= 300
    return result.reason


def test_good_record_gets_schema_fields_and_kafka_coordinates():
    result = parse(value(extra="ignored"))
    assert isinstance(result, Parsed)
    assert result.record == {
        "id": "a",
        "n": 1,
        "amount": None,  # schema default
        "note": None,
        "meta": {"ts": TS_MS},
        "_kafka_partition": 3,
        "_kafka_offset": 41,
        "_kafka_timestamp": 1_700_000_000_123,
        "_event_time": TS_MS,
    }
    assert result.folder == "dt=2024-06-01/hr=12"
    assert result.folder_time == NOW and result.event_time == TS_MS


def test_parsed_records_write_with_the_output_schema():
    buf = io.BytesIO()
    writer = AvroFileWriter(buf, output_schema(USER_SCHEMA))
    result = parse(value(amount=2.5, note="é\U0001f600"))
    writer.append(result.record, COORDS.offset, result.event_time)
    writer.close()
    buf.seek(0)
    assert list(fastavro.reader(buf)) == [as_read(result.record)]


@pytest.mark.parametrize(
    "encoding, ts",
    [
        ("epoch_millis", TS_MS),
        ("epoch_millis", float(TS_MS)),
        ("epoch_seconds", TS_MS // 1000),
        ("epoch_seconds", TS_MS / 1000),
        ("iso8601", "2024-06-01T12:30:00Z"),
        ("iso8601", "2024-06-01T14:30:00+02:00"),
        ("iso8601", "2024-06-01T12:30:00.000"),  # naive: the topic's timezone (UTC)
    ],
)
def test_each_event_time_encoding(encoding, ts):
    result = parse(value(ts=ts), cfg(encoding))
    assert isinstance(result, Parsed)
    assert result.event_time == TS_MS and result.record["_event_time"] == TS_MS


def test_folder_follows_topic_timezone_and_path_format():
    config = cfg("iso8601", timezone="America/New_York", path_format="d=%Y%m%d/h=%H%M")
    result = parse(value(ts="2024-06-01T02:30:00Z"), config)
    assert result.folder == "d=20240531/h=2230"
    assert result.folder_time.isoformat() == "2024-05-31T22:30:00-04:00"
    naive = parse(value(ts="2024-06-01T02:30:00"), config)  # read as New York time
    assert naive.event_time == TS_MS - 6 * 3600 * 1000


def test_processing_time_topics_use_the_processing_time():
    result = parse(value(ts="garbage"), cfg(time_source="processing"))
    assert isinstance(result, Parsed)
    assert result.folder == "dt=2024-06-01/hr=12" and result.folder_time == NOW
    assert result.event_time is None and result.record["_event_time"] is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        (None, "tombstone (null value)"),
        (b"\xff\xfe{}", "invalid UTF-8 at byte 0"),
        (b'{"id": "a"', "invalid JSON"),
        (b"", "invalid JSON"),
        (b'{"id": NaN}', "invalid JSON"),
        (b'\xef\xbb\xbf{"id": "a"}', "invalid JSON"),  # BOM
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested deeper than 999"),  # nesting bomb
        (b"{" * 1200 + b"}", "JSON nested deeper than 999"),  # invalid, and too deep
        (b"[1, 2]", "JSON value is array, not an object"),
        (b'"text"', "JSON value is string, not an object"),
        (b"null", "JSON value is null, not an object"),
    ],
)
def test_unparseable_values_are_quarantined(raw, expected):
    assert reason(raw).startswith(expected)


def nested(depth: int) -> bytes:
    """A valid value nested `depth` arrays and objects deep, with brackets inside a string."""
    inner = b"[" * (depth - 2) + b'"[[{{]"' + b"]" * (depth - 2)
    return value(extra={"x": "MARK"}).replace(b'"MARK"', inner)


def test_json_nested_to_the_limit_parses_wherever_it_is_parsed_and_deeper_is_refused():
    # the JVM's parser (Spark's parse_json: Jackson's 1,000 levels, one of them the fast path's
    # wrapper) takes the same depths; Python's own limit would depend on the caller's stack
    assert MAX_DEPTH == 999
    assert isinstance(parse(nested(MAX_DEPTH)), Parsed)
    assert reason(nested(MAX_DEPTH + 1)) == "JSON nested deeper than 999 arrays and objects"

    def deep_in_the_stack(frames: int, depth: int = MAX_DEPTH) -> Parsed | Quarantined:
        return parse(nested(depth)) if frames == 0 else deep_in_the_stack(frames - 1, depth)

    limit = sys.getrecursionlimit()
    assert isinstance(deep_in_the_stack(limit // 2), Parsed)
    assert sys.getrecursionlimit() == limit  # put back
    # fewer brackets than the limit: not scanned, and still parsed deep in the stack
    assert isinstance(deep_in_the_stack(limit // 2, depth=600), Parsed)


@pytest.mark.parametrize(
    "encoding, ts_json, expected",
    [
        ("epoch_millis", '"1717245000000"', "is string, expected a number"),
        ("epoch_millis", "true", "is boolean, expected a number"),
        ("epoch_millis", "null", "is null, expected a number"),
        ("epoch_millis", "1" + "0" * 30, "out of range"),
        ("epoch_millis", "-1000000000000000", "out of range"),
        ("epoch_millis", "1e400", "not finite"),
        ("epoch_seconds", '"soon"', "is string, expected a number"),
        ("epoch_seconds", "1717245000000", "out of range"),  # millis sent as seconds
        ("epoch_seconds", '{"s": 1}', "is object, expected a number"),
        ("iso8601", "1717245000", "is number, expected ISO-8601 string"),
        ("iso8601", '"yesterday"', "is not ISO-8601"),
        ("iso8601", '"2024-02-30T00:00:00Z"', "is not ISO-8601"),
        ("iso8601", '"0001-01-01T00:00:00Z"', "out of range"),
        ("iso8601", '"../../etc/passwd"', "is not ISO-8601"),
        ("iso8601", '"2024-06-01T00:00:00/../../x"', "is not ISO-8601"),
    ],
)
def test_bad_event_time_is_quarantined_naming_the_field(encoding, ts_json, expected):
    raw = b'{"id": "a", "n": 1, "note": null, "meta": {"ts": %s}}' % ts_json.encode()
    text = reason(raw, cfg(encoding))
    assert text.startswith("event time field 'meta.ts'") and expected in text


@pytest.mark.parametrize("raw", [b'{"id": "a", "n": 1}', b'{"id": "a", "n": 1, "meta": 5}'])
def test_missing_event_time_is_quarantined(raw):
    assert reason(raw) == "event time field 'meta.ts' is missing"


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"n": "1"}, "field 'n' does not fit the schema: got string, expected int"),
        ({"n": 2**31}, "field 'n' does not fit the schema: got number, expected int"),
        ({"n": True}, "field 'n' does not fit the schema: got boolean, expected int"),
        ({"id": None}, "field 'id' does not fit the schema: got null, expected string"),
        ({"amount": "x"}, "field 'amount' does not fit the schema"),
        ({"meta": {"ts": TS_MS, "x": 1}, "id": ["a"]}, "field 'id' does not fit the schema"),
    ],
)
def test_schema_mismatch_is_quarantined_naming_the_field(fields, expected):
    assert reason(value(**fields)).startswith(expected)


def test_missing_required_field_is_named():
    assert reason(b'{"n": 1, "note": null, "meta": {"ts": 1717245000000}}') == (
        "missing field 'id'"
    )


def test_nested_mismatch_names_the_nested_field():
    config = cfg("epoch_millis", event_time={"field": "n", "encoding": "epoch_millis"})
    assert reason(value(n=TS_MS // 10**6, ts=[1]), config) == (
        "field 'test.Meta.ts' does not fit the schema: got array, "
        "expected double or long or null or string"
    )


def test_lone_surrogate_is_quarantined_not_crashing_the_writer():
    assert "surrogate" in reason(value(note="\ud800"))
    assert isinstance(parse(value(note="\U0001f600")), Parsed)  # escaped pair is fine


def test_five_megabyte_values():
    big = "x" * (5 * 1024 * 1024)
    good = parse(value(note=big))
    assert isinstance(good, Parsed) and good.record["note"] == big
    # the reason stays short, not a copy of the value
    assert reason(value(n=big)).startswith("field 'n' does not fit the schema")
    assert reason(big.encode()).startswith("invalid JSON")
    assert reason(value(ts=big), cfg("iso8601")).startswith("event time field 'meta.ts'")


def test_unsafe_folder_is_quarantined_even_if_the_format_slipped_past_validation():
    config = cfg().model_copy(update={"path_format": "dt=%Y-%m-%d/../../etc"})
    assert reason(value(), config).startswith("unsafe partition folder")
