"""The JVM fast path against the Python reference parser, on real Spark: over a generated corpus
of valid records and every kind of poison, both write byte-identical files (so every record is in
the same place with the same datum), and the fast path does take the valid records."""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from cairn.config import TopicConfig
from cairn.datafiles import fastpath
from cairn.datafiles.writer import KafkaRecord, PartitionResult, write_partition
from cairn.formats.json import MAX_DEPTH
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from spark_jobs.archive import encoded

TOPIC, PARTITION = "diff.events", 2
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOW = datetime(2024, 2, 29, 23, 59, 30, tzinfo=UTC)  # processing time: a leap day's last minute
KAFKA_SCHEMA = (
    "topic string, partition int, offset long, timestamp timestamp, timestampType int, "
    "key binary, value binary, headers array<struct<key: string, value: binary>>"
)
SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "diff",
    "doc": "a doc with 'quotes' and a \\ backslash",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "int"},
        {"name": "big", "type": "long", "default": -7},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "ratio", "type": "double", "default": 0.5},
        {"name": "flag", "type": "boolean", "default": False},
        {"name": "note", "type": ["string", "null"], "default": "n/a"},
        {"name": "label", "type": ["null", "string"]},
        {"name": "ts", "type": ["null", "string"], "default": None},
    ],
}
DEFAULTED = {  # every field may be absent: only the object check keeps `[1]` or `5` out
    **SCHEMA,
    "fields": [
        {"name": "id", "type": "string", "default": ""},
        {"name": "n", "type": "int", "default": 0},
        *SCHEMA["fields"][2:7],
        {"name": "label", "type": ["null", "string"], "default": None},
        SCHEMA["fields"][8],
    ],
}
NUMBERS = [
    "0", "-0", "1", "-1", "2147483647", "2147483648", "-2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "99999999999999999999", "1.0", "-0.0", "0.0", "0.1", "1e2", "1E-2",
    "2.5", "-2.5e-3", "1e308", "1e309", "-1e309", "5e-324", "4.9e-325", "1.7976931348623157e308",
    "123456789012345678901234567890.5", "0.30000000000000004", "9007199254740993",
    "1.00000000000000011102230246251565404236316680908203125", "3.14159265358979323846264338",
    "1" + "0" * 400, "-" + "9" * 39, "0.000000000000000000000000000000000000001",
]  # fmt: skip
TIMES = [
    "2024-02-29T23:59:59.999Z", "2024-03-01T00:00:00Z", "2024-02-29T00:00:00+00:00",
    "2024-03-01T00:30:00+01:00", "2024-02-29T23:30:00-01:00", "2024-02-29T18:15:00-05:45",
    "2024-02-29T12:00:00.5Z", "2024-02-29T12:00:00.123456Z", "2024-02-29T12:00:00.1234567Z",
    "2024-02-29T12:00:00", "2024-02-29", "2024-02-29 12:00:00Z", "2024-02-29T12:00Z",
    "2023-02-29T12:00:00Z", "2024-13-01T00:00:00Z", "2024-02-29T24:00:00Z",
    "2024-02-29T23:59:60Z", "1969-12-31T23:59:59.9995Z", "1969-12-31T23:59:59.999Z",
    "1000-01-02T00:00:00Z", "1000-01-01T00:00:00Z", "0999-12-31T23:59:59Z",
    "9999-12-30T00:00:00Z", "9999-12-31T12:00:00Z", "2024-02-29T12:00:00+18:00",
    "2024-02-29T12:00:00+19:00", "2024-02-29T12:00:00-23:59", "2024-02-29T12:00:00z",
    "2024-02-29T12:00:00+0530", "2024-02-29T12:00:00.Z", "２０２４-02-29T12:00:00Z",
    "2024-11-03T01:30:00-04:00", "2024-11-03T01:30:00-05:00", "2024-03-10T02:30:00-05:00",
]  # fmt: skip
EPOCHS = [
    "0", "-1", "1709251199", "1709251200", "1709251199999", "1709251200000", "1.5", "1e3",
    "-62135596800", "253402214400", "253402300800", "99999999999999999999", "-0", "true",
    "\"1709251200\"", "null", "1709251199.9995",
]  # fmt: skip
UNICODE = ["é", "日本語", "🎉", "\u0000", "\u2028", "עברית", "e\u0301", "\uffff", "\u007f"]
STANDALONE = [
    b"", b"null", b"[]", b"[1]", b'"s"', b"5", b"true", b"{", b"[" * 2000 + b"]" * 2000,
    b"{'id': 'a', 'n': 1}", b'{"id": "a", "n": 1, "ratio": NaN}',  # what Python's json refuses
    b'{"id": "a", "n": 1, "ratio": -Infinity}',
]  # fmt: skip
WRAPS = [  # around a valid document `d`
    b"%s x", b"%s%s", b"%s, 5", b"%s] [", b"[%s]", b" \t\r\n%s\n", b"\xef\xbb\xbf%s", b"%s\x00",
    b"%s\r\n\r\n", b"%s /* c */", b"%s,", b'%s,"x"]', b"%s}", b"{%s",
]  # fmt: skip
INSIDE = [  # as the raw bytes of the "id" string's contents
    b"\x01", b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\\ud800", b"\\udc00x", b"\\ud83d\\ude00",
    b"\\uD83D\\uDE00", b"\\\\ud800", b"\\\\\\ud800", b"\\u0000", b"\\", b"\\x", b"\\u12", b"\t",
    b'\\"', b"\xf0\x9f\x8e\x89", b"\xf4\x90\x80\x80", b"\xe2\x80\xa8",
]  # fmt: skip


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def topic_cfg(tmp_path: Path, name: str, **entry: object) -> TopicConfig:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "event.avsc").write_text(json.dumps(entry.pop("avsc", SCHEMA)))
    base = {"topic": TOPIC, "format": "json", "schema": "event.avsc"}
    (folder / "topics.yaml").write_text(json.dumps({"topics": [base | entry]}))
    loaded = load_topics(folder / "topics.yaml")
    assert not loaded.errors, loaded.errors
    return loaded.topics[0]


def valid(rng: random.Random, when: datetime, time_field: str, encoding: str) -> dict:
    """A record the fast path must take, with values that vary in every field."""
    record: dict = {"id": "".join(rng.choices(string.printable, k=rng.randrange(0, 40)))}
    record["n"] = rng.choice([0, -1, 2**31 - 1, -(2**31), rng.randrange(-(10**6), 10**6)])
    if rng.random() < 0.8:
        record["big"] = rng.choice([2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)])
    if rng.random() < 0.8:
        # not 0.0: a decimal zero goes to Python by design (fastpath._TYPE_CHECKS)
        record["amount"] = rng.choice(
            [
                None,
                0,
                rng.random() * 10 ** rng.randrange(-5, 20),
                rng.choice([-1, 1]) * rng.randrange(1, 999) / 8,
            ]
        )
    if rng.random() < 0.5:
        record["ratio"] = rng.choice([1, -3.25, 1e-300, 6.02e23, 0.1 + 0.2])
    if rng.random() < 0.5:
        record["flag"] = rng.random() < 0.5
    if rng.random() < 0.5:
        record["note"] = rng.choice(UNICODE) * rng.randrange(1, 4)
    record["label"] = rng.choice([None, "", "x" * rng.randrange(1, 300)])
    if rng.random() < 0.3:
        record["extra"] = {"nested": [1, {"deep": None}], "s": "ignored"}
    millis = int(when.timestamp() * 1000)
    value: object = {
        "iso8601": when.isoformat(timespec="milliseconds"),
        "epoch_millis": millis,
        "epoch_seconds": millis // 1000,
    }.get(encoding)
    if encoding:
        parent = record
        *path, leaf = time_field.split(".")
        for part in path:
            parent = parent.setdefault(part, {})
        parent[leaf] = value
    return record


def corpus(
    rng: random.Random, time_field: str, encoding: str
) -> Iterator[tuple[bytes | None, bool]]:
    """(value, whether the fast path must take it): valid records around day edges in several
    offsets, then every poison kind, then valid records with one field made wrong."""
    zones = [UTC, *(timezone_of(h) for h in (-11, -5.75, 5.75, 13))]
    for i in range(1500):
        edge = NOW + timedelta(hours=rng.choice([-24, -1, 0, 1, 24]))
        when = (edge + timedelta(milliseconds=rng.randrange(-7_200_000, 7_200_000))).astimezone(
            rng.choice(zones)
        )
        record = valid(rng, when, time_field, encoding)
        text = json.dumps(record, ensure_ascii=rng.random() < 0.5)
        yield text.encode(), not SURROGATE_ESCAPE.search(text)  # those go to Python by design
        if i % 500 == 0:  # a large value
            text = json.dumps(record | {"label": "é" * 600_000}, ensure_ascii=False)
            yield text.encode(), not SURROGATE_ESCAPE.search(text)
    base = valid(rng, NOW, time_field, encoding)
    yield None, False  # a tombstone
    document = json.dumps(base).encode()
    for value in STANDALONE:
        yield value, False
    for depth in (990, MAX_DEPTH, MAX_DEPTH + 1):  # to the limit both paths keep, and past it
        deep = _set(base, "extra", "[" * (depth - 1) + "]" * (depth - 1))
        yield deep.encode(), depth <= MAX_DEPTH and not SURROGATE_ESCAPE.search(deep)
    for wrap in WRAPS:
        yield wrap.replace(b"%s", document), False
    for inside in INSIDE:
        yield _set(base, "id", '"MARK"').encode().replace(b"MARK", inside), False
    for field in ("n", "amount", "label"):  # a key twice, last one valid, or first one
        twice = json.dumps(base).replace("{", '{"' + field + '": "x", ', 1)
        yield twice.encode(), False
        yield twice.replace('"x"', "1").encode(), False
    fields = [*SCHEMA["fields"], {"name": time_field}]
    for field in (f["name"] for f in fields):
        for wrong in [*NUMBERS, *TIMES, *EPOCHS, '"text"', "null", "[]", "{}", '{"n":1}', "true"]:
            yield _set(base, field, wrong).encode(), False  # as JSON text (some invalid)
            yield _set(base, field, json.dumps(wrong)).encode(), False  # as a string
        yield json.dumps({k: v for k, v in base.items() if k != field}).encode(), False


def _set(record: dict, field: str, raw_json: str) -> str:
    """`record` as JSON text with `field` (dotted) set to the raw JSON text given."""
    *path, leaf = field.split(".")
    marker = "\u0007MARK\u0007"
    copy = json.loads(json.dumps(record))
    parent = copy
    for part in path:
        parent = parent.setdefault(part, {}) if isinstance(parent.get(part), dict) else {}
    parent[leaf] = marker
    return json.dumps(copy).replace(json.dumps(marker), raw_json)


def timezone_of(hours: float):
    from datetime import timezone

    return timezone(timedelta(hours=hours))


def kafka_records(values: list[bytes | None]) -> list[KafkaRecord]:
    """The values as records of one partition, with keys and headers present, empty or null."""
    keys = [b"k", None, b"", "ключ".encode()]
    headers = [[("trace", b"\x00\xff"), ("empty", None)], [], None, [("h", b"")]]
    return [
        KafkaRecord(
            TOPIC, PARTITION, 1000 + i, 1_709_251_000_000 + i, i % 2, keys[i % 4], v, headers[i % 4]
        )
        for i, v in enumerate(values)
    ]


def through_spark(spark, cfg: TopicConfig, rows: list[KafkaRecord], url: str) -> tuple:
    """The archive job's JVM encoding and Python assembly over `rows`, as one Spark task."""
    source = spark.createDataFrame(
        [
            (r.topic, r.partition, r.offset, EPOCH + timedelta(milliseconds=r.timestamp),
             r.timestamp_type, r.key, r.value,
             None if r.headers is None else [{"key": k, "value": v} for k, v in r.headers])
            for r in rows
        ],
        KAFKA_SCHEMA,
    ).coalesce(1)  # fmt: skip
    frame = encoded(source, cfg)
    accepted = frame.where("datum IS NOT NULL").select("offset").collect()

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        result = write_partition(batches, cfg, Storage(url), NOW, "a-diff")
        yield pa.RecordBatch.from_pylist([{"result": result.model_dump_json()}])

    (row,) = frame.mapInArrow(write, "result string").collect()
    return PartitionResult.model_validate_json(row.result), {r.offset for r in accepted}


CASES = {
    "iso8601 in UTC, hourly": dict(event_time={"field": "ts", "encoding": "iso8601"}),
    "iso8601 nested, Kathmandu minutes": dict(
        event_time={"field": "meta.at", "encoding": "iso8601"},
        timezone="Asia/Kathmandu",
        path_format="dt=%Y-%m-%d/hr=%H/min=%M",
    ),
    "epoch millis, New York": dict(
        event_time={"field": "ts_ms", "encoding": "epoch_millis"}, timezone="America/New_York"
    ),
    "epoch millis in a schema field": dict(event_time={"field": "big", "encoding": "epoch_millis"}),
    "epoch seconds, daily in Pago Pago": dict(
        event_time={"field": "at", "encoding": "epoch_seconds"},
        timezone="Pacific/Pago_Pago",
        path_format="day=%Y%m%d",
    ),
    "processing time": dict(time_source="processing", path_format="dt=%Y-%m-%d"),
    "processing time, every field defaulted": dict(
        time_source="processing", path_format="dt=%Y-%m-%d", avsc=DEFAULTED
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_fast_path_and_reference_write_the_same_bytes(spark, tmp_path, case):
    entry = dict(CASES[case])
    cfg = topic_cfg(tmp_path, "cfg", **entry)
    assert fastpath.gap(cfg) is None
    spec = entry.get("event_time") or {"field": "ts", "encoding": ""}
    rng = random.Random(case)
    items = list(corpus(rng, spec["field"], spec["encoding"]))
    rows = kafka_records([value for value, _ in items])

    reference = write_partition(rows, cfg, Storage((tmp_path / "ref").as_uri()), NOW, "a-diff")
    fast, accepted = through_spark(spark, cfg, rows, (tmp_path / "fast").as_uri())

    assert fast == reference
    ref_files = sorted(p.relative_to(tmp_path / "ref") for p in (tmp_path / "ref").rglob("*.avro"))
    fast_root = tmp_path / "fast"
    assert ref_files == sorted(p.relative_to(fast_root) for p in fast_root.rglob("*.avro"))
    for name in ref_files:
        assert (tmp_path / "ref" / name).read_bytes() == (fast_root / name).read_bytes(), name
    kinds = {e.kind for e in reference.files}
    assert kinds == {"backup", "partitioned", "quarantine"}
    must = {r.offset for r, (_, fast_ok) in zip(rows, items, strict=True) if fast_ok}
    assert not must - accepted, [items[o - 1000][0][:300] for o in sorted(must - accepted)[:5]]
    assert len(accepted) < len(rows)  # and the poison did not


def test_topics_the_fast_path_cannot_take_are_parsed_in_python_with_the_same_bytes(spark, tmp_path):
    tags = {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
    nested = {**SCHEMA, "fields": [*SCHEMA["fields"], tags]}
    cfg = topic_cfg(tmp_path, "cfg", avsc=nested, event_time={"field": "ts", "encoding": "iso8601"})
    assert fastpath.gap(cfg) == 'field \'tags\' has type {"type": "array", "items": "string"}'
    rows = kafka_records([value for value, _ in corpus(random.Random(3), "ts", "iso8601")][:400])
    reference = write_partition(rows, cfg, Storage((tmp_path / "ref").as_uri()), NOW, "a-diff")
    fast, accepted = through_spark(spark, cfg, rows, (tmp_path / "fast").as_uri())
    assert fast == reference and not accepted
    for entry in reference.files:
        ref = (tmp_path / "ref" / entry.key).read_bytes()
        assert ref == (tmp_path / "fast" / entry.key).read_bytes()
