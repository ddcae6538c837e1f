"""The Avro format (`cairn.formats.avro`): Confluent-framed and plain values, writer schemas from
a folder or a Schema Registry, resolved to the topic's reader schema; everything else quarantined
with its reason."""

from __future__ import annotations

import io
import json
import shutil
import struct
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import pytest

from cairn.config import TopicConfig, TopicSnapshot
from cairn.datafiles.avro_file import AvroFileWriter
from cairn.formats import REGISTRIES_VARIABLE, open_format, registries_from_env, registry_ids
from cairn.formats.avro import AvroFormat, RegistryUnavailable, SchemaFolder, registry_config
from cairn.formats.base import KafkaCoords, Parsed, Quarantined, output_schema
from cairn.topics_file import load_topics

TS = datetime(2024, 6, 1, 12, 30, tzinfo=UTC)
TS_MS = 1_717_245_000_000
PAID_AT_LONG = {"name": "paid_at", "type": "long"}
COORDS = KafkaCoords(partition=2, offset=7, timestamp=1_700_000_000_000)
NOW = datetime(2024, 7, 1, tzinfo=UTC)
PAID_AT = {"name": "paid_at", "type": {"type": "long", "logicalType": "timestamp-millis"}}

READER = {
    "type": "record",
    "name": "Payment",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string", "default": "EUR"},
        PAID_AT,
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V1 = {  # amount as float (promoted to double), no currency/note (defaults), legacy dropped
    **READER,
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "float"},
        PAID_AT,
        {"name": "legacy", "type": "int"},
    ],
}
V2 = READER
V3 = {  # amount as a string: does not resolve to double
    **READER,
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "string"}, PAID_AT],
}
WRITERS = {101: (1, V1), 102: (2, V2), 103: (3, V3)}


def avro(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def framed(schema_id: int, record: dict) -> bytes:
    """The Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian), Avro."""
    return struct.pack(">bI", 0, schema_id) + avro(WRITERS[schema_id][1], record)


def topics(tmp_path: Path, avro_section: dict | None, **entry) -> Path:
    (tmp_path / "payment.avsc").write_text(json.dumps(READER))
    folder = tmp_path / "writers" / "payments-value"
    folder.mkdir(parents=True, exist_ok=True)
    for schema_id, (version, schema) in WRITERS.items():
        (folder / f"{version}-{schema_id}.avsc").write_text(json.dumps(schema))
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    base = {"topic": "payments", "format": "avro", "schema": "payment.avsc"}
    base |= {"event_time": {"field": "paid_at"}}
    if avro_section is not None:
        base["avro"] = avro_section
    path = tmp_path / "topics.yaml"
    path.write_text(json.dumps({"topics": [base | entry]}))
    return path


def config(tmp_path: Path, avro_section: dict | None = None, **entry) -> TopicConfig:
    section = {"schemas_dir": "writers"} if avro_section is None else avro_section
    loaded = load_topics(topics(tmp_path, section, **entry))
    assert not loaded.errors, loaded.errors
    return loaded.topics[0]


def errors(tmp_path: Path, avro_section: dict | None, **entry) -> list[tuple[str, str]]:
    loaded = load_topics(topics(tmp_path, avro_section, **entry))
    assert not loaded.topics
    return [(e.field, e.message) for e in loaded.errors]


def reason(result: Parsed | Quarantined) -> str:
    assert isinstance(result, Quarantined), result
    assert len(result.reason) <= 300
    return result.reason


def test_every_writer_version_resolves_to_the_reader_schema(tmp_path):
    fmt = open_format(config(tmp_path))
    old = fmt.parse(
        framed(101, {"id": "a", "amount": 1.5, "paid_at": TS, "legacy": 9}), COORDS, NOW
    )
    new = {"id": "b", "amount": 2.25, "currency": "USD", "paid_at": TS, "note": "hi"}
    assert isinstance(old, Parsed)
    assert old.record == {
        "id": "a",
        "amount": 1.5,  # float promoted to double
        "currency": "EUR",  # added since: the reader's default
        "paid_at": TS,
        "note": None,
        "_kafka_partition": 2,
        "_kafka_offset": 7,
        "_kafka_timestamp": 1_700_000_000_000,
        "_event_time": TS_MS,
    }  # and `legacy`, removed since, is gone
    assert old.folder == "dt=2024-06-01/hr=12" and old.event_time == TS_MS
    parsed = fmt.parse(framed(102, new), COORDS, NOW)
    assert isinstance(parsed, Parsed) and parsed.record["currency"] == "USD"

    buf = io.BytesIO()  # what a format accepts, the partitioned writer writes
    writer = AvroFileWriter(buf, output_schema(READER))
    for result in (old, parsed):
        writer.append(result.record, COORDS.offset, result.event_time)
    writer.close()
    buf.seek(0)
    assert [r["id"] for r in fastavro.reader(buf)] == ["a", "b"]


GOOD = {"id": "a", "amount": 1.0, "currency": "EUR", "paid_at": TS, "note": None}
V1_RECORD = {"id": "p", "amount": 3.0, "paid_at": TS, "legacy": 0}


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, "tombstone (null value)"),
        (struct.pack(">bI", 0, 999) + b"\x02a", "unknown writer schema id 999"),
        (b"hello world", "not Confluent-framed: magic byte 104, expected 0"),
        (b"\x00\x00\x00", "3 bytes, shorter than the Confluent header (5 bytes)"),
        (framed(102, GOOD)[:8], "not Avro of writer schema id 102: the value ends early"),
        (
            framed(102, GOOD) + b"\x00\x00",
            "2 bytes left after the Avro value (writer schema id 102)",
        ),
        (
            framed(103, {"id": "a", "amount": "1.0", "paid_at": TS}),
            "writer schema id 103 does not resolve to the reader schema",
        ),
    ],
)
def test_values_that_do_not_decode_are_quarantined_with_the_reason(tmp_path, value, expected):
    assert reason(open_format(config(tmp_path)).parse(value, COORDS, NOW)).startswith(expected)


def test_unknown_ids_are_looked_up_once(tmp_path):
    fmt = open_format(config(tmp_path))
    assert isinstance(fmt, AvroFormat)
    for _ in range(3):
        fmt.parse(struct.pack(">bI", 0, 5) + b"x", COORDS, NOW)
    fmt.parse(framed(101, {"id": "a", "amount": 1.0, "paid_at": TS, "legacy": 1}), COORDS, NOW)
    info = fmt.writer_by_id.cache_info()
    assert (info.misses, info.hits) == (2, 2)


def test_plain_values_use_the_fixed_writer_schema(tmp_path):
    fmt = open_format(config(tmp_path, {"framing": "plain", "writer_schema": "v1.avsc"}))
    value = avro(V1, V1_RECORD)
    result = fmt.parse(value, COORDS, NOW)
    assert isinstance(result, Parsed) and result.record["currency"] == "EUR"
    assert reason(fmt.parse(value[:3], COORDS, NOW)) == (
        "not Avro of the writer_schema: the value ends early"
    )


@pytest.mark.parametrize(
    "event_time, logical, value, expected",
    [
        ({"field": "paid_at"}, "timestamp-micros", TS, TS_MS),
        ({"field": "paid_at", "encoding": "epoch_millis"}, "timestamp-millis", TS, TS_MS),
        ({"field": "paid_at", "encoding": "epoch_millis"}, None, TS_MS, TS_MS),
        ({"field": "paid_at", "encoding": "epoch_seconds"}, None, TS_MS // 1000, TS_MS),
    ],
)
def test_event_time_from_a_decoded_field(tmp_path, event_time, logical, value, expected):
    field = dict(PAID_AT_LONG)
    if logical:
        field["type"] = {"type": "long", "logicalType": logical}
    schema = {**READER, "fields": [{"name": "id", "type": "string"}, field]}
    (tmp_path / "ts.avsc").write_text(json.dumps(schema))
    cfg = config(
        tmp_path,
        {"framing": "plain", "writer_schema": "ts.avsc"},
        schema="ts.avsc",
        event_time=event_time,
    )
    result = open_format(cfg).parse(avro(schema, {"id": "a", "paid_at": value}), COORDS, NOW)
    assert isinstance(result, Parsed) and result.event_time == expected


def test_a_long_field_without_encoding_is_refused_when_the_file_loads(tmp_path):
    schema = {**READER, "fields": [{"name": "id", "type": "string"}, PAID_AT_LONG]}
    (tmp_path / "ts.avsc").write_text(json.dumps(schema))
    section = {"framing": "plain", "writer_schema": "ts.avsc"}
    assert errors(tmp_path, section, schema="ts.avsc", event_time={"field": "paid_at"}) == [
        (
            "event_time.encoding",
            "an event time without encoding cannot read field 'paid_at', whose schema type is "
            "long: every record would be quarantined; encodings that fit: epoch_seconds, "
            "epoch_millis",
        )
    ]


def test_registry_values_keep_the_client_wire_format(tmp_path):
    """Values that confluent-kafka's own AvroSerializer writes decode through the registry
    path; the client's in-memory registry (`mock://`) answers as a real one does."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    cfg = config(tmp_path, {"registry": "cairn_schema_registry"})
    assert registry_ids(cfg) == ["cairn_schema_registry"]
    with pytest.raises(LookupError, match="cairn_schema_registry"):
        open_format(cfg)
    fmt = open_format(cfg, {"cairn_schema_registry": {"url": "mock://registry"}})
    client = fmt.schemas.client
    ctx = SerializationContext("payments", MessageField.VALUE)
    old = AvroSerializer(client, json.dumps(V1))(
        {"id": "a", "amount": 1.5, "paid_at": TS, "legacy": 1}, ctx
    )
    new = AvroSerializer(client, json.dumps(V2))(GOOD, ctx)
    assert old[0] == 0 and old[1:5] != new[1:5]  # two versions, two ids

    results = [fmt.parse(value, COORDS, NOW) for value in (old, new)]
    assert [r.record["currency"] for r in results] == ["EUR", "EUR"]
    unknown = struct.pack(">bI", 0, 4242) + old[5:]
    assert reason(fmt.parse(unknown, COORDS, NOW)) == "unknown writer schema id 4242"


def test_registry_config_from_a_connection(monkeypatch):
    config = registry_config("sr.example.com", 8081, "key", "secret", {"timeout": 5})
    assert config == {
        "url": "http://sr.example.com:8081",
        "timeout": 5,
        "basic.auth.user.info": "key:secret",
    }
    assert registry_config("https://sr", None, None, None, {}) == {"url": "https://sr"}
    assert registries_from_env() == {}
    monkeypatch.setenv(REGISTRIES_VARIABLE, json.dumps({"sr": config}))
    assert registries_from_env() == {"sr": config}


@pytest.mark.parametrize(
    "section, entry, field, message",
    [
        (None, {}, "avro", "give exactly one of registry (a connection id) or schemas_dir"),
        ({"registry": "sr", "schemas_dir": "w"}, {}, "avro", "give exactly one"),
        ({"framing": "plain"}, {}, "avro", "framing: plain needs writer_schema"),
        ({"framing": "plain", "writer_schema": "v1.avsc", "registry": "sr"}, {}, "avro", "drop"),
        ({"writer_schema": "v1.avsc", "registry": "sr"}, {}, "avro", "writer_schema is for"),
        ({"registry": "sr", "typo": 1}, {}, "avro.typo", "Extra inputs are not permitted"),
        ({"framing": "xml"}, {}, "avro.framing", "Input should be 'confluent' or 'plain'"),
        ({"schemas_dir": "nowhere"}, {}, "avro.schemas_dir", "is not a folder"),
        ({"framing": "plain", "writer_schema": "no.avsc"}, {}, "avro.writer_schema", "no.avsc"),
        ({"registry": "sr"}, {"event_time": None}, "event_time", "avro topics need event_time"),
        ({"registry": "sr"}, {"schema": None}, "schema", "avro topics need an Avro schema"),
    ],
)
def test_bad_avro_entries_name_the_field(tmp_path, section, entry, field, message):
    found = errors(tmp_path, section, **entry)
    assert found[0][0] == field and message in found[0][1], found


def test_format_sections_belong_to_their_format(tmp_path):
    path = tmp_path / "topics.yaml"
    path.write_text(
        json.dumps(
            {
                "topics": [
                    {"topic": "a", "format": "json", "avro": {}, "time_source": "processing"},
                    {"topic": "b", "format": "protobuf"},
                ]
            }
        )
    )
    found = {e.entry: (e.field, e.message) for e in load_topics(path).errors}
    assert found["topic 'a'"] == ("avro", "Extra inputs are not permitted")
    assert found["topic 'b'"] == (
        "format",
        "unknown format 'protobuf'; expected one of avro, json, raw",
    )


def test_schema_folder_layout_is_checked(tmp_path):
    cfg = config(tmp_path)
    folder = tmp_path / "w" / "subject"
    folder.mkdir(parents=True)
    (folder / "1-7.avsc").write_text(json.dumps(V1))
    assert SchemaFolder(cfg, "w").paths == {7: "w/subject/1-7.avsc"}
    (tmp_path / "w" / "other").mkdir()
    (tmp_path / "w" / "other" / "4-7.avsc").write_text(json.dumps(V2))
    with pytest.raises(ValueError, match="schema id 7 also in"):
        SchemaFolder(cfg, "w")
    (tmp_path / "w" / "other" / "4-7.avsc").rename(tmp_path / "w" / "other" / "v4.avsc")
    with pytest.raises(ValueError, match=r"<subject>/<version>-<id>\.avsc"):
        SchemaFolder(cfg, "w")
    with pytest.raises(ValueError, match="is not a folder"):
        SchemaFolder(cfg, "nowhere")


@pytest.mark.parametrize(
    "section", [{"schemas_dir": "writers"}, {"framing": "plain", "writer_schema": "v1.avsc"}]
)
def test_a_snapshot_parses_with_the_files_it_carries_and_none_from_disk(tmp_path, section):
    """A Spark job gets the entry as a snapshot: its executors have no topics folder."""
    (tmp_path / "topics").mkdir()
    snapshot = config(tmp_path / "topics", section).snapshot()
    shutil.rmtree(tmp_path / "topics")  # nothing of the topics folder is left to read

    cfg = TopicSnapshot.model_validate_json(snapshot.model_dump_json()).topic()

    assert cfg.user_schema == READER
    if "writer_schema" in section:
        parsed = open_format(cfg).parse(avro(V1, V1_RECORD), COORDS, NOW)
        assert parsed.record["amount"] == pytest.approx(V1_RECORD["amount"])
    else:
        assert sorted(snapshot.files) == [
            "payment.avsc",
            *(f"writers/payments-value/{v}-{i}.avsc" for i, (v, _) in WRITERS.items()),
        ]
        parsed = open_format(cfg).parse(framed(102, GOOD), COORDS, NOW)
        assert parsed.record["id"] == GOOD["id"]
    with pytest.raises(FileNotFoundError, match="did not travel with the entry"):
        cfg.read_file("elsewhere.avsc")


def test_an_unreachable_registry_fails_the_run_instead_of_quarantining(tmp_path):
    cfg = config(tmp_path, {"registry": "sr"})
    fmt = open_format(cfg, {"sr": registry_config("127.0.0.1", 1, None, None, {"max.retries": 0})})
    with pytest.raises(RegistryUnavailable, match=r"Schema Registry http://127.0.0.1:1: id 102"):
        fmt.parse(framed(102, GOOD), COORDS, NOW)
