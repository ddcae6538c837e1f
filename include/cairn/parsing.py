"""The JSON parser: one Kafka value in, a schema-conforming record or a quarantine reason out.

It never raises on content. Whatever it accepts is guaranteed to encode with the output schema
(so the partitioned writer cannot fail mid-file); whatever it refuses carries a short reason that
names the offending field, and the caller quarantines the record verbatim.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

import fastavro
from fastavro.validation import ValidationError, validate

from cairn.layout import event_folder, is_safe_folder

if TYPE_CHECKING:
    from cairn.config import EventTime, TopicConfig

COORDINATE_FIELDS: list[dict[str, Any]] = [
    {"name": "_kafka_partition", "type": "int"},
    {"name": "_kafka_offset", "type": "long"},
    {"name": "_kafka_timestamp", "type": "long", "doc": "Kafka record timestamp, epoch millis"},
    {
        "name": "_event_time",
        "type": ["null", "long"],
        "default": None,
        "doc": "event time, epoch millis; null for processing-time topics",
    },
]
_RESERVED = {f["name"] for f in COORDINATE_FIELDS}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# A day inside years 1000..9999 so that in any timezone %Y renders as four digits.
_MIN_MS = (datetime(1000, 1, 2, tzinfo=UTC) - _EPOCH) // _MS
_MAX_MS = (datetime(9999, 12, 30, tzinfo=UTC) - _EPOCH) // _MS
_MAX_REASON = 300
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_JSON_TYPES |= {dict: "object", list: "array"}


@dataclass(frozen=True)
class KafkaCoords:
    partition: int
    offset: int
    timestamp: int  # Kafka record timestamp, epoch millis


@dataclass(frozen=True)
class Parsed:
    record: dict[str, Any]
    folder: str  # relative folder under partitioned/<topic>/
    folder_time: datetime  # event time (or processing time) in the topic's timezone
    event_time: int | None  # epoch millis; None for processing-time topics


@dataclass(frozen=True)
class Quarantined:
    reason: str


class _Reject(Exception):
    """Internal: the record goes to quarantine with this message."""


def output_schema(user_schema: dict[str, Any]) -> dict[str, Any]:
    """The partitioned files' schema: the user's record plus the Kafka coordinate fields."""
    fields = user_schema.get("fields")
    if user_schema.get("type") != "record" or not isinstance(fields, list):
        raise ValueError("the topic schema must be an Avro record with fields")
    clash = sorted(_RESERVED & {f.get("name") for f in fields})
    if clash:
        raise ValueError(f"schema fields {clash} are reserved for Kafka coordinates")
    return {**user_schema, "fields": [*fields, *COORDINATE_FIELDS]}


def compile_schema(user_schema: dict[str, Any]) -> dict[str, Any]:
    """Parse the output schema once per topic; `parse_record` takes the result."""
    return fastavro.parse_schema(output_schema(user_schema))


def parse_record(
    value: bytes | bytearray | memoryview | None,
    cfg: TopicConfig,
    schema: dict[str, Any],
    coords: KafkaCoords,
    processing_time: datetime,
) -> Parsed | Quarantined:
    """Parse one JSON value of topic `cfg` into `schema` (from `compile_schema`)."""
    try:
        return _parse(value, cfg, schema, coords, processing_time)
    except _Reject as reject:
        return Quarantined(str(reject)[:_MAX_REASON])


def _parse(
    value: bytes | bytearray | memoryview | None,
    cfg: TopicConfig,
    schema: dict[str, Any],
    coords: KafkaCoords,
    processing_time: datetime,
) -> Parsed:
    if value is None:
        raise _Reject("tombstone (null value)")
    try:
        text = str(value, "utf-8")
    except UnicodeDecodeError as err:
        raise _Reject(f"invalid UTF-8 at byte {err.start}") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:
        raise _Reject(f"invalid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise _Reject(f"JSON value is {_json_type(obj)}, not an object")

    tz = cfg.tzinfo
    if cfg.event_time is None:
        event_ms, when = None, processing_time
    else:
        event_ms = _event_millis(obj, cfg.event_time, tz)
        when = _EPOCH + event_ms * _MS
    folder = event_folder(cfg.path_format, when, tz)
    if not is_safe_folder(folder):
        raise _Reject(f"unsafe partition folder {folder!r}")

    record, missing = {}, set()
    for field in schema["fields"]:
        name = field["name"]
        if name in obj:
            record[name] = obj[name]
        elif "default" in field:
            record[name] = field["default"]
        else:
            record[name] = None
            missing.add(name)
    record |= {
        "_kafka_partition": coords.partition,
        "_kafka_offset": coords.offset,
        "_kafka_timestamp": coords.timestamp,
        "_event_time": event_ms,
    }
    # The quick check first: with raise_errors=True fastavro builds an error object for every
    # union branch that does not match, even on valid records; only a misfit pays for the reason.
    if not validate(record, schema, raise_errors=False):
        try:
            validate(record, schema, raise_errors=True)
        except ValidationError as err:
            raise _Reject(_mismatch(err, schema["name"], missing)) from None
    if _ESCAPED_SURROGATE.search(text):
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _Reject("string with a lone UTF-16 surrogate cannot be written") from None
    return Parsed(record, folder, when.astimezone(tz), event_ms)


def _event_millis(obj: dict[str, Any], spec: EventTime, tz: tzinfo) -> int:
    """Epoch millis of the event-time field, in range for a four-digit-year folder."""
    name = spec.field
    raw: Any = obj
    for part in name.split("."):
        if not isinstance(raw, dict) or part not in raw:
            raise _Reject(f"event time field '{name}' is missing")
        raw = raw[part]
    if spec.encoding == "iso8601":
        if not isinstance(raw, str):
            raise _Reject(
                f"event time field '{name}' is {_json_type(raw)}, expected ISO-8601 string"
            )
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            raise _Reject(f"event time field '{name}' is not ISO-8601: {raw[:40]!r}") from None
        if parsed.tzinfo is None:  # no offset given: the topic's timezone
            parsed = parsed.replace(tzinfo=tz)
        millis = (parsed - _EPOCH) // _MS
    else:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise _Reject(f"event time field '{name}' is {_json_type(raw)}, expected a number")
        if not math.isfinite(raw):
            raise _Reject(f"event time field '{name}' is not finite")
        scale = 1000 if spec.encoding == "epoch_seconds" else 1
        millis = raw * scale if isinstance(raw, int) else round(raw * scale)
    if not _MIN_MS <= millis <= _MAX_MS:
        raise _Reject(f"event time field '{name}' is out of range (years 1000-9999)")
    return millis


def _mismatch(err: ValidationError, record_name: str, missing: set[str]) -> str:
    """A short reason naming the field that does not fit.

    fastavro names a field by its innermost record: top-level fields come out as plain names,
    nested ones as `<Record fullname>.<field>`.
    """
    first = err.errors[0]
    path = first.field.removeprefix(record_name + ".")
    if path in missing:
        return f"missing field '{path}'"
    expected = sorted({_avro_type(e.schema) for e in err.errors if e.field == first.field})
    return (
        f"field '{path}' does not fit the schema: got {_json_type(first.datum)}, "
        f"expected {' or '.join(expected)}"
    )


def _avro_type(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return "union" if isinstance(schema, list) else str(schema)


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")
