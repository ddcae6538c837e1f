"""Which topics the JVM fast path takes, and the shape of what it asks Spark for (the bytes it
writes are compared with the Python parser's in tests/integration/test_fastpath.py)."""

from __future__ import annotations

import json
import re

import pytest

from cairn.config import TopicConfig
from cairn.datafiles import fastpath
from cairn.topics_file import load_topics

FLAT = [
    {"name": "s", "type": "string", "doc": "it's"},
    {"name": "n", "type": ["null", "long"], "default": None},
    {"name": "d", "type": [{"type": "double"}, "null"], "default": 0.5},
    {"name": "b", "type": "boolean", "default": True},
    {"name": "i", "type": "int"},
]


def topic(tmp_path, fields: list, fmt: str = "json", field: str | None = "ts") -> TopicConfig:
    schema = {"type": "record", "name": "R", "fields": fields}
    (tmp_path / "r.avsc").write_text(json.dumps(schema))
    entry: dict = {"topic": "t", "format": fmt, "schema": "r.avsc"}
    if field is None:
        entry["time_source"] = "processing"
    else:
        entry["event_time"] = {"field": field, "encoding": "epoch_millis"}
    if fmt == "avro":
        entry["avro"] = {"framing": "plain", "writer_schema": "r.avsc"}
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": [entry]}))
    loaded = load_topics(tmp_path / "topics.yaml")
    assert not loaded.errors, loaded.errors
    return loaded.topics[0]


def test_flat_json_topics_are_parsed_in_the_jvm(tmp_path):
    assert fastpath.gap(topic(tmp_path, FLAT, field="meta.ts_2")) is None


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"name": "a", "type": {"type": "array", "items": "string"}}, "field 'a' has type"),
        ({"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}, "'t'"),
        ({"name": "u", "type": ["null", "string", "long"]}, "field 'u'"),
        ({"name": "f", "type": "float"}, "field 'f'"),
        ({"name": "r", "type": {"type": "record", "name": "In", "fields": []}}, "field 'r'"),
    ],
)
def test_other_field_types_keep_the_topic_on_the_python_parser(tmp_path, extra, reason):
    assert reason in (fastpath.gap(topic(tmp_path, [*FLAT, extra])) or "")


def test_other_formats_and_odd_event_time_paths_stay_in_python(tmp_path):
    assert fastpath.gap(topic(tmp_path, FLAT, field="a-b")) is not None
    (tmp_path / "avro").mkdir()
    assert fastpath.gap(topic(tmp_path / "avro", FLAT, fmt="avro", field="n")) == (
        "avro values are decoded in Python"
    )


def test_projections_end_in_the_output_columns_and_carry_the_schema_as_a_literal(tmp_path):
    cfg = topic(tmp_path, FLAT)
    projections = fastpath.select(cfg, "NonceNonce")
    last = projections[-1]
    names = [re.split(r"\bAS ", e)[-1].strip() for e in last]
    assert tuple(names) == fastpath.OUTPUT_COLUMNS
    sql = " ".join(e for p in projections for e in p)
    assert "it\\'s" in sql  # the schema's doc, quoted as a Spark SQL literal
    assert "NonceNonce" in sql
    with pytest.raises(ValueError, match="nonce"):
        fastpath.select(cfg, "x'; DROP")


def test_a_topic_the_jvm_cannot_parse_still_gets_its_backup_datums_there(tmp_path):
    cfg = topic(tmp_path, [*FLAT, {"name": "f", "type": "float"}])
    (only,) = fastpath.select(cfg, "NonceNonce")
    assert any(e.startswith("to_avro(") and e.endswith("AS backup") for e in only)
    assert "CAST(NULL AS BINARY) AS datum" in only


OBJECT_CHECK = "RLIKE '^[ \\t\\n\\r]*[{]'"


@pytest.mark.parametrize(
    ("fields", "field", "regex"),
    [
        (FLAT, "ts", False),  # the event time field must be found
        (FLAT, None, False),  # `s` and `i` have no default
        (FLAT[1:4], None, True),  # every field may be absent: only the regex keeps `5` out
    ],
)
def test_the_object_regex_runs_only_where_no_lookup_must_succeed(tmp_path, fields, field, regex):
    sql = " ".join(
        e for p in fastpath.select(topic(tmp_path, fields, field=field), "x" * 8) for e in p
    )
    assert (OBJECT_CHECK in sql) is regex
