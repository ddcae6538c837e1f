"""An Avro topic archived end to end with real Kafka and Spark: Confluent-framed values of two
writer schema versions resolved to the reader schema, writer schemas from a schemas_dir, and
unknown ids, undecodable bytes and incompatible writers quarantined with the reason, while the
backup keeps every value verbatim. Then the Schema Registry path, from the job's environment to
the client on Spark's executors, against a stand-in registry (no real one installs here: see
`cairn.formats.avro`)."""

from __future__ import annotations

import io
import json
import struct
import textwrap
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fastavro
import pytest

from cairn.formats.avro import registry_config
from cairn.topics_file import find_topic
from cairn_stack.demo import create_topic, produce
from tests.integration.conftest import coords, read_archive

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
    ],
}
V1 = {  # amount as float (promoted to double), no currency (the reader's default), legacy dropped
    **READER,
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "float"},
        PAID_AT,
        {"name": "legacy", "type": "int"},
    ],
}
V2 = READER
V3 = {**READER, "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "string"}]}
WRITERS = {11: (1, V1), 12: (2, V2), 13: (3, V3)}  # id: (version, schema)
DAY1 = datetime(2024, 6, 1, 12, 30, tzinfo=UTC)
DAY2 = datetime(2024, 6, 2, 8, 0, tzinfo=UTC)


def framed(schema_id: int, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(WRITERS[schema_id][1]), record)
    return struct.pack(">bI", 0, schema_id) + out.getvalue()


def avro_topic(tmp_path: Path, topic: str, source: str = "schemas_dir: writers"):
    """A topics file for `topic` (format avro, writer schemas from `source`) and its config."""
    (tmp_path / "payment.avsc").write_text(json.dumps(READER))
    folder = tmp_path / "writers" / f"{topic}-value"
    folder.mkdir(parents=True)
    for schema_id, (version, schema) in WRITERS.items():
        (folder / f"{version}-{schema_id}.avsc").write_text(json.dumps(schema))
    path = tmp_path / "topics.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            topics:
              - topic: {topic}
                format: avro
                schema: payment.avsc
                event_time: {{field: paid_at}}
                archive_root: {(tmp_path / "archive").as_uri()}
                avro:
                  {source}
            """
        )
    )
    return find_topic(topic, path)


def test_avro_topic_is_resolved_quarantined_and_backed_up_verbatim(
    kafka, archiver, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    good = {
        0: [
            framed(11, {"id": f"a{i}", "amount": 1.5, "paid_at": DAY1, "legacy": i})
            for i in range(3)
        ],
        1: [
            framed(12, {"id": f"b{i}", "amount": 2.25, "currency": "USD", "paid_at": DAY2})
            for i in range(3)
        ],
    }
    bad = {
        0: [struct.pack(">bI", 0, 999) + b"\x04a1", b"not avro at all"],
        1: [framed(13, {"id": "c", "amount": "1.0"}), good[1][0][:7]],
    }
    values = {p: good[p] + bad[p] for p in (0, 1)}
    for p, batch in values.items():
        produce(kafka, topic_name, batch, partition=p)
    cfg = avro_topic(tmp_path, topic_name)

    summary = archiver.run(cfg)

    assert summary is not None and summary.counts.backup == 10
    assert summary.counts.quarantined == 4
    contents = read_archive(archiver.storage(cfg), topic_name)
    backup = {(r["partition"], r["offset"]): r["value"] for r in contents.backup}
    assert backup == {(p, o): v for p, batch in values.items() for o, v in enumerate(batch)}

    parsed = {row["id"]: (folder, row) for folder, row in contents.partitioned}
    assert sorted(parsed) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    folder, a0 = parsed["a0"]
    assert folder == "dt=2024-06-01/hr=12"
    assert {k: a0[k] for k in ("amount", "currency", "paid_at")} == {
        "amount": 1.5,
        "currency": "EUR",  # written by v1, which had no currency: the reader's default
        "paid_at": DAY1,
    }
    assert "legacy" not in a0 and a0["_event_time"] == DAY1  # timestamp-millis: a datetime
    folder, b0 = parsed["b0"]
    assert folder == "dt=2024-06-02/hr=08" and b0["currency"] == "USD"

    reasons = {(r["partition"], r["offset"]): r["reason"] for r in contents.quarantine}
    assert reasons[(0, 3)] == "unknown writer schema id 999"
    assert reasons[(0, 4)] == "not Confluent-framed: magic byte 110, expected 0"
    assert reasons[(1, 3)].startswith("writer schema id 13 does not resolve to the reader schema")
    assert reasons[(1, 4)] == "not Avro of writer schema id 12: the value ends early"
    assert {r["value"] for r in contents.quarantine} == {*bad[0], *bad[1]}  # verbatim

    # A rebuild re-derives the same records from the backup through the same format.
    assert archiver.rebuild(cfg, date(2024, 6, 1), date(2024, 6, 2)) is not None
    again = read_archive(archiver.storage(cfg), topic_name)
    assert sorted(
        coords([r for _, r in again.partitioned], "_kafka_partition", "_kafka_offset")
    ) == (sorted(coords([r for _, r in contents.partitioned], "_kafka_partition", "_kafka_offset")))


class _Registry(BaseHTTPRequestHandler):
    """`GET /schemas/ids/<id>` of the Schema Registry REST API, behind basic auth."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Basic a2V5OnNlY3JldA==":  # key:secret
            return self._answer(401, {"error_code": 40101, "message": "Unauthorized"})
        schema_id = int(self.path.rsplit("/", 1)[-1].split("?")[0])
        if schema_id not in WRITERS:
            return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
        self._answer(200, {"schema": json.dumps(WRITERS[schema_id][1])})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_writer_schemas_from_a_registry_reach_the_spark_executors(
    kafka, archiver, topic_name, tmp_path, registry_url, monkeypatch
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    values = [
        framed(11, {"id": "a", "amount": 1.5, "paid_at": DAY1, "legacy": 1}),
        framed(12, {"id": "b", "amount": 2.0, "currency": "USD", "paid_at": DAY2}),
        struct.pack(">bI", 0, 77) + b"\x02x",
    ]
    produce(kafka, topic_name, values, partition=0)
    cfg = avro_topic(tmp_path, topic_name, "registry: cairn_schema_registry")
    # What the operator puts in the job's input (never argv), from the connection.
    config = registry_config(registry_url, None, "key", "secret", {"max.retries": 0})
    archiver.registries = {"cairn_schema_registry": config}

    summary = archiver.run(cfg)

    assert summary is not None and summary.counts.quarantined == 1
    contents = read_archive(archiver.storage(cfg), topic_name)
    assert sorted((row["id"], row["currency"]) for _, row in contents.partitioned) == [
        ("a", "EUR"),
        ("b", "USD"),
    ]
    assert [r["reason"] for r in contents.quarantine] == ["unknown writer schema id 77"]
