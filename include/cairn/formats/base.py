"""What every input format shares: the parse result types, the partitioned files' schema, and
where a parsed record is filed by its event time.

A format (`cairn.formats`) turns one Kafka value into a `Parsed` record that is guaranteed to
encode with the topic's output schema (so the partitioned writer cannot fail mid-file), or into
`Quarantined` with a short reason naming what is wrong; it never raises on content. Everything
here is format-neutral, so a new format only decodes its bytes into a record.

Formats see a topic through `Topic`, the few settings they read, and never import
`cairn.config`: the topics file asks the formats to check its entries, not the other way.
"""

from __future__ import annotations

import io
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, cast

import fastavro
from fastavro.schema import SchemaParseException, UnknownType, expand_schema
from pydantic import BaseModel, ConfigDict, field_validator

from cairn.storage.layout import event_folder, is_safe_folder

TIMESTAMP_MILLIS: dict[str, str] = {"type": "long", "logicalType": "timestamp-millis"}
"""Epoch millis that Spark, Trino and Hive read as timestamps; writers give ints, fastavro
reads back aware datetimes (files written before it was used hold plain longs: `millis` takes
both)."""

COORDINATE_FIELDS: list[dict[str, Any]] = [
    {"name": "_kafka_partition", "type": "int"},
    {"name": "_kafka_offset", "type": "long"},
    {"name": "_kafka_timestamp", "type": TIMESTAMP_MILLIS, "doc": "Kafka record timestamp"},
    {
        "name": "_event_time",
        "type": ["null", TIMESTAMP_MILLIS],
        "default": None,
        "doc": "event time; null for processing-time topics",
    },
]
_RESERVED = {f["name"] for f in COORDINATE_FIELDS}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# A day inside years 1000..9999 so that in any timezone %Y renders as four digits.
MIN_EVENT_MS = (datetime(1000, 1, 2, tzinfo=UTC) - _EPOCH) // _MS
MAX_EVENT_MS = (datetime(9999, 12, 30, tzinfo=UTC) - _EPOCH) // _MS
MAX_REASON = 300
_FIELD_PATH_RE = re.compile(r"[^.\s]+(\.[^.\s]+)*")
_TYPE_NAMES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
_TYPE_NAMES |= {dict: "object", list: "array", bytes: "bytes", datetime: "timestamp"}
_ENCODINGS: tuple[str | None, ...] = (None, "epoch_seconds", "epoch_millis", "iso8601")
_TIMESTAMP_TYPES = {
    "timestamp-millis",
    "timestamp-micros",
    "local-timestamp-millis",
    "local-timestamp-micros",
}


class EventTime(BaseModel):
    """Where a record's event time is: a dotted field path and how its value encodes a time.

    Without `encoding` the field must be an Avro timestamp (`timestamp-millis`/`-micros` logical
    type); a decoded timestamp is accepted whatever the encoding.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    field: str
    """Dotted path of the event-time field in the record, e.g. ts or meta.ts."""
    encoding: Literal["epoch_seconds", "epoch_millis", "iso8601"] | None = None
    """How the field encodes a time; leave out for an Avro timestamp-millis/-micros field."""

    @field_validator("field")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not _FIELD_PATH_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a dotted field path like 'ts' or 'meta.ts'")
        return value


Registries = Mapping[str, Mapping[str, Any]]
"""Schema Registry client configurations by Airflow connection id (`avro.registry_config`)."""


class Topic(Protocol):
    """What a format reads of a topic's configuration (`cairn.config.TopicConfig` has it)."""

    @property
    def label(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def event_time(self) -> EventTime | None: ...
    @property
    def time_source(self) -> str: ...
    @property
    def path_format(self) -> str: ...
    @property
    def tzinfo(self) -> tzinfo: ...
    @property
    def schema_path(self) -> Path | None: ...
    @property
    def user_schema(self) -> dict[str, Any] | None: ...
    @property
    def base_dir(self) -> Path: ...
    def read_file(self, relative: str) -> bytes: ...
    def file_names(self, folder: str, pattern: str) -> list[str]: ...
    @property
    def format_settings(self) -> BaseModel | None: ...


class FieldError(ValueError):
    """A topic entry that cannot be archived as it is, naming the (dotted) field to blame: what
    a format's `check` raises, and the configuration's own cross-field checks."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


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
    datum: bytes = b""  # `record` encoded with the output schema (set by `ParsingFormat.parse`)


@dataclass(frozen=True)
class Filing:
    """Where a record goes: the part of `Parsed` that its time decides."""

    folder: str
    folder_time: datetime
    event_time: int | None


@dataclass(frozen=True)
class Quarantined:
    reason: str


class Reject(Exception):
    """Raised inside a format: the record goes to quarantine with this message."""


class Format(ABC):
    """One input format, as the topics file names it (`format: <name>`).

    A subclass names itself, may declare `Settings`, the pydantic model of the entry's section
    named like the format (`avro: {...}`), and checks the entries that use it. Formats that
    parse subclass `ParsingFormat`; a backup-only format (raw) subclasses this directly.
    """

    name: ClassVar[str]
    Settings: ClassVar[type[BaseModel] | None] = None
    parses: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def check(cls, topic: Topic) -> None:
        """Refuse (FieldError) an entry this format cannot archive.

        Runs once the entry's schema path resolves, so a missing or clashing file is an entry
        error when the topics file loads, not a failed run.
        """

    @classmethod
    def registry_ids(cls, topic: Topic) -> list[str]:
        """The Schema Registry connections this topic's values need (none by default)."""
        return []

    @classmethod
    def files(cls, topic: Topic) -> list[str]:
        """The files of the format's own settings that the topic needs, besides its schema
        (relative to the topics file): they travel with the entry to Spark jobs."""
        return []


class ParsingFormat(Format):
    """A format that parses: a topic's Kafka values into records of its output schema.

    Built once per writer (`cairn.formats.open_format`); `parse` never raises on content.
    """

    parses = True
    decodes_timestamps: ClassVar[bool] = False
    """Whether values arrive as records of the schema, decoded (an Avro timestamp as a datetime,
    which any encoding reads), or as the format's own text and numbers (JSON, whose event-time
    field need not be in the schema)."""

    @classmethod
    def check(cls, topic: Topic) -> None:
        """A record schema, and event time or processing time but not both."""
        if topic.schema_path is None:
            raise FieldError("schema", f"{cls.name} topics need an Avro schema (.avsc)")
        if topic.time_source == "processing" and topic.event_time is not None:
            raise FieldError("event_time", "drop it, or drop time_source: processing")
        if topic.time_source == "event" and topic.event_time is None:
            raise FieldError(
                "event_time", f"{cls.name} topics need event_time or time_source: processing"
            )
        try:
            output_schema(topic.user_schema or {})
        except ValueError as err:
            raise FieldError("schema", str(err)) from None
        if topic.event_time is not None:
            cls._check_event_time(topic.user_schema or {}, topic.event_time)

    @classmethod
    def _check_event_time(cls, schema: dict[str, Any], spec: EventTime) -> None:
        """Refuse an encoding that cannot read the schema's event-time field: every record
        would be quarantined. A field the schema lacks is refused only where values are the
        schema's records (JSON reads the event time from the object itself)."""
        found = field_type(schema, spec.field)
        if found is None:
            if cls.decodes_timestamps:
                raise FieldError("event_time.field", f"'{spec.field}' is not a field of the schema")
            return
        fits = encodings_for(found, cls.decodes_timestamps)
        if spec.encoding in fits:
            return
        shown = json.dumps(found, separators=(",", ":")).strip('"')
        named = [e or "no encoding (a timestamp logical type)" for e in _ENCODINGS if e in fits]
        choice = f"encodings that fit: {', '.join(named)}" if named else "no encoding fits it"
        what = f"encoding {spec.encoding}" if spec.encoding else "an event time without encoding"
        raise FieldError(
            "event_time.encoding",
            f"{what} cannot read field '{spec.field}', whose schema type is {shown}: every record "
            f"would be quarantined; {choice}",
        )

    def __init__(self, topic: Topic, registries: Registries | None = None) -> None:
        """`registries`: Schema Registry client configurations by connection id, for the
        formats that look up writer schemas; the others ignore it."""
        self.topic = topic
        self.schema = parsed_record_schema(output_schema(topic.user_schema or {}))
        """The partitioned files' schema, parsed once."""

    def parse(
        self,
        value: bytes | bytearray | memoryview | None,
        coords: KafkaCoords,
        processing_time: datetime,
    ) -> Parsed | Quarantined:
        """One Kafka value as a record of `self.schema`, or the reason it is quarantined."""
        try:
            if value is None:
                raise Reject("tombstone (null value)")
            parsed = self.decode(value, coords, processing_time)
            return replace(parsed, datum=self._encode(parsed.record))
        except Reject as reject:
            return Quarantined(str(reject)[:MAX_REASON])

    def _encode(self, record: dict[str, Any]) -> bytes:
        """The record's datum. Encoding here, not in the file, keeps a value that passes
        validation but cannot be written (an integer too large for a double) out of the file:
        it is quarantined instead of failing the run."""
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, self.schema, record)
        except (OverflowError, ValueError, TypeError) as err:
            raise Reject(f"a value does not fit the schema: {err}") from None
        return out.getvalue()

    @abstractmethod
    def decode(
        self, value: bytes | bytearray | memoryview, coords: KafkaCoords, processing_time: datetime
    ) -> Parsed:
        """The value as a `Parsed` record (`filing` then `parsed` do the shared part); raises
        `Reject` for anything that does not fit."""

    def filing(self, fields: dict[str, Any], processing_time: datetime) -> Filing:
        """Where a record goes: its event time (read from `fields`) or the processing time."""
        topic, tz = self.topic, self.topic.tzinfo
        if topic.event_time is None:
            event_ms, when = None, processing_time
        else:
            event_ms = event_millis(fields, topic.event_time, tz)
            when = _EPOCH + event_ms * _MS
        folder = event_folder(topic.path_format, when, tz)
        if not is_safe_folder(folder):
            raise Reject(f"unsafe partition folder {folder!r}")
        return Filing(folder, when.astimezone(tz), event_ms)

    def parsed(self, record: dict[str, Any], coords: KafkaCoords, filing: Filing) -> Parsed:
        """`record` (the topic schema's fields) plus the Kafka coordinates, filed by `filing`."""
        record |= {
            "_kafka_partition": coords.partition,
            "_kafka_offset": coords.offset,
            "_kafka_timestamp": coords.timestamp,
            "_event_time": filing.event_time,
        }
        return Parsed(record, filing.folder, filing.folder_time, filing.event_time)


def load_schema(path: str | Path, data: bytes | None = None) -> dict[str, Any]:
    """Read an .avsc file that must hold a record schema (`data`: its bytes, already read);
    return it as plain JSON (unparsed)."""
    try:
        schema = json.loads(Path(path).read_bytes() if data is None else data)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise ValueError("top level must be an Avro record")
        if not isinstance(schema.get("fields"), list):
            raise ValueError("record has no 'fields' list")
        fastavro.parse_schema(schema)
    except UnknownType as err:
        raise ValueError(f"schema {path}: unknown type {err}") from None
    except (OSError, ValueError, SchemaParseException) as err:
        raise ValueError(f"schema {path}: {err}") from None
    return schema


def parsed_record_schema(schema: dict[str, Any], **named: Any) -> dict[str, Any]:
    """fastavro's parse of a record schema, typed as the dict it is (its type says any schema)."""
    return cast(dict[str, Any], fastavro.parse_schema(schema, **named))


def output_schema(user_schema: dict[str, Any]) -> dict[str, Any]:
    """The partitioned files' schema: the user's record plus the Kafka coordinate fields."""
    fields = user_schema.get("fields")
    if user_schema.get("type") != "record" or not isinstance(fields, list):
        raise ValueError("the topic schema must be an Avro record with fields")
    clash = sorted(_RESERVED & {f.get("name") for f in fields})
    if clash:
        raise ValueError(f"schema fields {clash} are reserved for Kafka coordinates")
    return {**user_schema, "fields": [*fields, *COORDINATE_FIELDS]}


def event_millis(record: dict[str, Any], spec: EventTime, tz: tzinfo) -> int:
    """Epoch millis of the event-time field, in range for a four-digit-year folder.

    Numbers and ISO-8601 strings follow `spec.encoding`; a datetime (an Avro timestamp logical
    type, decoded) is taken as it is, a naive one (`local-timestamp-*`) in the topic's timezone.
    """
    name = spec.field
    raw: Any = record
    for part in name.split("."):
        if not isinstance(raw, dict) or part not in raw:
            raise Reject(f"event time field '{name}' is missing")
        raw = raw[part]
    if isinstance(raw, datetime):
        millis = (_aware(raw, tz) - _EPOCH) // _MS
    elif spec.encoding is None:
        raise Reject(
            f"event time field '{name}' is {type_name(raw)}, expected an Avro timestamp "
            "(or set event_time.encoding)"
        )
    elif spec.encoding == "iso8601":
        if not isinstance(raw, str):
            raise Reject(f"event time field '{name}' is {type_name(raw)}, expected ISO-8601 string")
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            raise Reject(f"event time field '{name}' is not ISO-8601: {raw[:40]!r}") from None
        millis = (_aware(parsed, tz) - _EPOCH) // _MS
    else:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise Reject(f"event time field '{name}' is {type_name(raw)}, expected a number")
        scale = 1000 if spec.encoding == "epoch_seconds" else 1
        if isinstance(raw, float) and not math.isfinite(raw * scale):
            raise Reject(f"event time field '{name}' is not finite")
        millis = raw * scale if isinstance(raw, int) else round(raw * scale)
    if not MIN_EVENT_MS <= millis <= MAX_EVENT_MS:
        raise Reject(f"event time field '{name}' is out of range (years 1000-9999)")
    return millis


def field_type(schema: dict[str, Any], path: str) -> Any:
    """The Avro type of the dotted field `path` in a record schema (named types expanded, a
    nullable record followed); None if the schema has no such field."""
    found: Any = expand_schema(schema)
    for part in path.split("."):
        records = [t for t in _branches(found) if isinstance(t, dict) and t.get("type") == "record"]
        fields = [f for r in records for f in r.get("fields", []) if f.get("name") == part]
        if not fields:
            return None
        found = fields[0]["type"]
    return found


def encodings_for(avro_type: Any, decoded: bool) -> set[str | None]:
    """The `event_time.encoding`s that read a field of this Avro type (None: no encoding, the
    value is a decoded timestamp). `decoded`: the format decodes logical types."""
    fits: set[str | None] = set()
    for branch in _branches(avro_type):
        logical = branch.get("logicalType") if isinstance(branch, dict) else None
        base = branch.get("type") if isinstance(branch, dict) else branch
        if decoded and logical in _TIMESTAMP_TYPES:
            fits |= set(_ENCODINGS)
        elif decoded and logical is not None:
            continue  # a date, decimal, uuid...: decoded to what no encoding reads
        elif base in ("int", "long", "float", "double"):
            fits |= {"epoch_seconds", "epoch_millis"}
        elif base == "string":
            fits.add("iso8601")
    return fits


def _branches(avro_type: Any) -> list[Any]:
    """A union's types but null; any other type alone."""
    return [t for t in avro_type if t != "null"] if isinstance(avro_type, list) else [avro_type]


def type_name(value: Any) -> str:
    """A value's type as a reason names it (JSON's words where they apply)."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _aware(when: datetime, tz: tzinfo) -> datetime:
    """No offset given: the topic's timezone."""
    return when if when.tzinfo is not None else when.replace(tzinfo=tz)
