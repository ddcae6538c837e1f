"""What the formats share (`cairn.formats.base`, the registry in `cairn.formats`): the output
schema, event time from a decoded record, and one class per `format:` name."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from cairn.config import TopicConfig
from cairn.formats import FORMATS, format_class, open_format
from cairn.formats.base import (
    EventTime,
    Format,
    ParsingFormat,
    Reject,
    event_millis,
    load_schema,
    output_schema,
)

USER_SCHEMA = {
    "type": "record",
    "name": "Event",
    "fields": [{"name": "id", "type": "string"}, {"name": "meta", "type": "string"}],
}
TS_MS = 1_717_245_000_000  # 2024-06-01T12:30:00Z


def test_output_schema_appends_coordinates_and_refuses_clashes():
    schema = output_schema(USER_SCHEMA)
    names = [f["name"] for f in schema["fields"]]
    assert names[-4:] == ["_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_event_time"]
    assert USER_SCHEMA["fields"][-1]["name"] == "meta"  # input untouched
    clash = {**USER_SCHEMA, "fields": [{"name": "_kafka_offset", "type": "long"}]}
    with pytest.raises(ValueError, match="_kafka_offset"):
        output_schema(clash)
    with pytest.raises(ValueError):
        output_schema({"type": "enum", "name": "E", "symbols": ["A"]})


@pytest.mark.parametrize(
    "value, encoding",
    [
        (datetime(2024, 6, 1, 12, 30, tzinfo=UTC), None),  # Avro timestamp-millis, decoded
        (datetime(2024, 6, 1, 12, 30, tzinfo=UTC), "epoch_millis"),  # whatever the encoding
        (datetime(2024, 6, 1, 14, 30), None),  # local-timestamp-*: the topic's timezone
        ("2024-06-01T14:30:00", "iso8601"),
        (TS_MS, "epoch_millis"),
    ],
)
def test_event_time_from_decoded_values(value, encoding):
    spec = EventTime(field="a.b", encoding=encoding)
    assert event_millis({"a": {"b": value}}, spec, ZoneInfo("Europe/Berlin")) == TS_MS


def test_a_number_needs_an_encoding():
    with pytest.raises(Reject, match="expected an Avro timestamp"):
        event_millis({"ts": TS_MS}, EventTime(field="ts"), UTC)


def test_every_format_is_registered_under_its_name():
    assert set(FORMATS) == {"json", "raw", "avro"}
    for name, cls in FORMATS.items():
        assert cls.name == name and issubclass(cls, Format)
        assert cls.parses == issubclass(cls, ParsingFormat)
    with pytest.raises(ValueError, match="unknown format 'csv'; expected one of avro, json, raw"):
        format_class("csv")


def test_raw_topics_have_no_parser():
    raw = TopicConfig(topic="t", format="raw")
    assert not raw.parses and raw.format_settings is None
    with pytest.raises(ValueError, match="backup only"):
        open_format(raw)


def test_load_schema(tmp_path):
    good = tmp_path / "good.avsc"
    good.write_text(json.dumps({"type": "record", "name": "R", "fields": []}))
    assert load_schema(good)["name"] == "R"

    cases = {
        "missing.avsc": None,
        "notjson.avsc": "{",
        "enum.avsc": json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}),
        "nofields.avsc": json.dumps({"type": "record", "name": "R"}),
        "badtype.avsc": json.dumps(
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}
        ),
    }
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=name):
            load_schema(tmp_path / name)
