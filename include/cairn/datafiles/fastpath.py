"""The JVM side of the archive: Spark SQL that encodes every record's backup datum and, for JSON
topics, parses, checks and encodes its partitioned datum, so Python only assembles Avro blocks.

Python parsing costs tens of microseconds a record; the JVM does the same work for a few. But
the Python parser (`cairn.formats`) stays the reference: it alone decides quarantine reasons, and
the JVM may only take a record when it is certain to give the same bytes. So the fast path is
*sound, not complete*: it accepts a value only when every check below holds, and hands anything
else (invalid JSON, duplicate keys, a wrong type, a lone surrogate, a number it cannot prove
equal...) to the reference, which parses or quarantines it. `tests/integration/test_fastpath.py`
proves over a generated corpus that both paths write byte-identical files.

How a value is judged (JSON text → Spark VARIANT, Spark 4.0):
- `try_parse_json('[' || value || ',{"<nonce>":0}]')`: the value is exactly one JSON document
  (the parser ignores text after the first one; the array's second element holding the nonce,
  random per job so no value holds it, proves the value was one element and parsing reached the
  end), with no duplicate keys, nested at most 1,000 levels with the wrapper (Jackson's limit;
  the reference keeps the same one, `cairn.formats.json.MAX_DEPTH`); plus valid UTF-8 and no
  `\\uD8xx`-style escapes (Python and Java decode lone surrogates differently);
- each schema field is absent with a default, JSON null in a nullable field, or of the variant
  type that Python's validation also accepts (see `_TYPE_CHECKS`), within the Avro type's range;
- the event time is an integer (epoch encodings) or a strict ISO-8601 string with an offset, in
  the four-digit-year range.

Only flat schemas of string, boolean, int, long, double fields (each optionally a union with
null) qualify; `gap` names what keeps any other topic on the Python parser. The record's folder
is rendered in Python from its event time (`cairn.datafiles.writer`), so folder names always follow
Python's timezone database, the same one a rebuild uses.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from cairn.datafiles.avro_file import BACKUP_SCHEMA
from cairn.formats.base import MAX_EVENT_MS, MIN_EVENT_MS, output_schema

if TYPE_CHECKING:
    from cairn.formats.base import Topic

OUTPUT_COLUMNS = ("topic", "partition", "offset", "timestamp", "backup", "datum", "event_time")
"""What `select` gives each record: Kafka coordinates (timestamp in epoch millis), the backup
datum, and the partitioned datum with its event time (null when the reference must parse)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGERS = "('TINYINT', 'SMALLINT', 'INT', 'BIGINT')"
_SQL_TYPES = {"string": "string", "boolean": "boolean", "int": "int", "long": "bigint"}
_SQL_TYPES["double"] = "double"
_INT32 = (-(2**31), 2**31 - 1)
# Strict ISO-8601 with an explicit offset; a time without one is the topic's local time, where
# DST gaps and folds make Java and Python disagree, so the reference takes those.
_ISO = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9])$"
)
_SURROGATE_ESCAPE = r"\\\\u[dD][89a-fA-F]"  # as the reference's check, in SQL-escaped form


def gap(topic: Topic) -> str | None:
    """Why the JVM cannot parse this topic's values (None when it can): the reason is logged,
    and every record goes to the Python parser."""
    if topic.format != "json":
        return f"{topic.format} values are decoded in Python"
    if topic.event_time is not None and not all(
        _NAME.fullmatch(p) for p in topic.event_time.field.split(".")
    ):
        return f"event time field {topic.event_time.field!r} is not a plain dotted name"
    for field in (topic.user_schema or {}).get("fields", []):
        if _field_type(field) is None:
            return f"field {field.get('name')!r} has type {json.dumps(field.get('type'))}"
    return None


def select(topic: Topic, nonce: str) -> list[list[str]]:
    """Spark SQL projections, applied in order (`selectExpr`) to Spark's Kafka source, giving
    `OUTPUT_COLUMNS` for each record.

    `nonce` (random letters, fresh per job) closes the wrapper that proves a value is one whole
    JSON document; it never reaches the output, so output bytes do not depend on it. Parsed
    values (`_whole`, each field's column `_field<i>` as `_field_column` reads it, its value
    `_value<i>`, a string field's variant `_variant<i>` where it is not a string, any other
    field's variant type `_type<i>`, `_time`, `_time_value`, `_event`) are named columns, so
    each is computed once a record: looking a key up and reading a typed value out of a variant
    are the costly steps.
    """
    coords = [
        "topic",
        "partition",
        "offset",
        "unix_millis(timestamp) AS timestamp",
        f"{_to_avro(_backup_struct(), BACKUP_SCHEMA)} AS backup",
    ]
    if gap(topic) is not None:
        return [[*coords, "CAST(NULL AS BINARY) AS datum", "CAST(NULL AS BIGINT) AS event_time"]]
    if not re.fullmatch(r"[A-Za-z]{8,64}", nonce):
        raise ValueError("the nonce must be 8 to 64 ASCII letters")
    text = "CAST(value AS STRING)"
    event, event_ok = _event_time(topic)
    fields = (topic.user_schema or {})["fields"]
    typed = _typed(fields)
    checks = [
        f"variant_get(_whole, '$[1].{nonce}') IS NOT NULL",
        f"is_valid_utf8({text})",
        # contains first (a byte scan; instr counts characters): the regex runs only on values
        # with an escape at all
        f"NOT contains({text}, '\\\\u') OR NOT {text} RLIKE '{_SURROGATE_ESCAPE}'",
        # the document is an object (a regex over the whole text: only where no other check
        # implies it)
        *([] if _object_implied(topic) else [f"{text} RLIKE '^[ \\t\\n\\r]*[{{]'"]),
        event_ok,
        *(_field_ok(f, i) for i, f in enumerate(fields)),
    ]
    record = [f"'{f['name']}', {_value(i)}" for i, f in enumerate(fields)]
    record += [
        "'_kafka_partition', partition",
        "'_kafka_offset', offset",
        "'_kafka_timestamp', unix_millis(timestamp)",
        "'_event_time', _event",
    ]
    datum = _to_avro(f"named_struct({', '.join(record)})", output_schema(topic.user_schema or {}))
    accepted = f"coalesce({' AND '.join(f'({c})' for c in checks)}, false)"
    return [
        ["*", f"try_parse_json(concat('[', {text}, ',{{\"{nonce}\":0}}]')) AS _whole"],
        ["*", *(f"{_field_column(f)} AS {_column(i)}" for i, f in enumerate(fields))],
        [
            "*",
            *(
                f"CASE WHEN {_column(i)} IS NULL THEN {_lookup(f)} END AS {_variant(i)}"
                for i, f in enumerate(fields)
                if i not in typed
            ),
            *(f"schema_of_variant({_column(i)}) AS {_type(i)}" for i in typed),
            f"{_time_path(topic)} AS _time",
        ],
        ["*", *(f"{_field_value(f, i)} AS {_value(i)}" for i, f in enumerate(fields))],
        ["*", f"{_time_value(topic)} AS _time_value"],
        ["*", f"{event} AS _event"],
        ["*", f"{accepted} AS _accepted"],
        [
            *coords,
            f"CASE WHEN _accepted THEN {datum} END AS datum",
            "CASE WHEN _accepted THEN _event END AS event_time",
        ],
    ]


def _backup_struct() -> str:
    empty = "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>)"
    return (
        "named_struct('topic', topic, 'partition', partition, 'offset', offset, "
        "'timestamp', unix_millis(timestamp), 'timestamp_type', timestampType, "
        f"'key', key, 'value', value, 'headers', coalesce(headers, {empty}))"
    )


def _to_avro(struct: str, schema: dict[str, Any]) -> str:
    return f"to_avro({struct}, {_literal(json.dumps(schema))})"


def _literal(text: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _field_type(field: dict[str, Any]) -> tuple[str, bool] | None:
    """(primitive, nullable) for the field types the fast path writes, else None."""
    t = field.get("type")
    names = [_primitive(b) for b in (t if isinstance(t, list) else [t])]
    kinds = [n for n in names if n != "null"]
    if len(kinds) != 1 or kinds[0] not in _SQL_TYPES or len(names) > 2:
        return None
    return kinds[0], len(names) == 2


def _primitive(schema: Any) -> str | None:
    """`"long"` or `{"type": "long"}` (no logical type or other attribute) as its name."""
    if isinstance(schema, dict) and set(schema) == {"type"}:
        schema = schema["type"]
    return schema if isinstance(schema, str) else None


def _field_column(field: dict[str, Any]) -> str:
    """What `_column` holds for the field: a string field's UTF-8 bytes when it is a string (null
    when absent, null or of another type: one lookup and one typed read for the common case),
    any other field as a variant (null: absent)."""
    if _field_type(field)[0] == "string":  # type: ignore[index]
        return f"try_variant_get(_whole, '$[0].{field['name']}', 'binary')"
    return _lookup(field)


def _lookup(field: dict[str, Any]) -> str:
    """The field as a variant, looked up in the document (null: absent)."""
    return f"variant_get(_whole, '$[0].{field['name']}')"


def _field_ok(field: dict[str, Any], index: int) -> str:
    """Whether the schema's field `index` is one the reference accepts."""
    kind, nullable = _field_type(field)  # type: ignore[misc]
    absent = "true" if _may_be_absent(field) else "false"
    null = "true" if nullable else "false"
    column = _column(index)
    if kind == "string":
        v = _variant(index)
        typed = f"WHEN {column} IS NOT NULL THEN true "
        otherwise = "false"
    else:
        v, typed = column, ""
        otherwise = _TYPE_CHECKS[kind].format(type=_type(index), value=_value(index))
    return (
        f"CASE {typed}WHEN {v} IS NULL THEN {absent} WHEN is_variant_null({v}) THEN {null} "
        f"ELSE {otherwise} END"
    )


def _may_be_absent(field: dict[str, Any]) -> bool:
    """Whether the reference accepts a document without the field: it has a default that fits."""
    kind, nullable = _field_type(field)  # type: ignore[misc]
    return "default" in field and _fits(field["default"], kind, nullable)


def _object_implied(topic: Topic) -> bool:
    """Whether the other checks already reject a document that is not a JSON object: a lookup
    in anything else finds nothing, and an event time field, or a schema field that may not be
    absent, must be found."""
    fields = (topic.user_schema or {})["fields"]
    return topic.event_time is not None or not all(_may_be_absent(f) for f in fields)


def _field_value(field: dict[str, Any], index: int) -> str:
    """The field's value as written: its default when absent, null when JSON null."""
    kind, _ = _field_type(field)  # type: ignore[misc]
    sql = _SQL_TYPES[kind]
    default = _default(field.get("default"), kind) if "default" in field else "NULL"
    v = _column(index)
    if kind == "string":
        return (
            f"CASE WHEN {v} IS NOT NULL THEN CAST({v} AS STRING) "
            f"WHEN {_variant(index)} IS NULL THEN CAST({default} AS STRING) END"
        )
    if kind == "double":  # through Java's correctly rounded parser, as Python's float()
        value = f"try_cast(try_variant_get({v}, '$', 'string') AS DOUBLE)"
    else:
        value = f"try_variant_get({v}, '$', '{sql}')"
    return (
        f"CASE WHEN {v} IS NULL THEN CAST({default} AS {sql}) "
        f"WHEN is_variant_null({v}) THEN CAST(NULL AS {sql}) ELSE {value} END"
    )


# What Python's validation accepts, as the variant types that prove it (`{type}`: the field's
# variant type, `{value}`: its value as written, null where an int does not fit; a string
# field's check is its column, see `_field_column`). A DECIMAL zero is left out for doubles:
# "-0.0" parses to a decimal without its sign.
_TYPE_CHECKS = {
    "boolean": "{type} = 'BOOLEAN'",
    "long": f"{{type}} IN {_INTEGERS}",
    "int": f"{{type}} IN {_INTEGERS} AND {{value}} IS NOT NULL",
    "double": (
        f"{{type}} IN {_INTEGERS} OR ({{type}} = 'DOUBLE' AND abs({{value}}) < double('Infinity'))"
        " OR ({type} LIKE 'DECIMAL%' AND {value} != 0)"
    ),
}


def _fits(default: Any, kind: str, nullable: bool) -> bool:
    """Whether the reference would accept this default as the field's value."""
    if default is None:
        return nullable
    if kind == "string":
        return isinstance(default, str)
    if kind == "boolean":
        return isinstance(default, bool)
    if isinstance(default, bool) or not isinstance(default, int | float):
        return False
    if kind == "double":
        return math.isfinite(default)
    return isinstance(default, int) and (kind == "long" or _INT32[0] <= default <= _INT32[1])


def _default(default: Any, kind: str) -> str:
    if default is None:
        return "NULL"
    if kind == "string":
        return _literal(default)
    if kind == "boolean":
        return "true" if default else "false"
    return f"'{float(default)!r}'" if kind == "double" else str(int(default))


def _column(index: int) -> str:
    """The column holding the schema's field `index` as `_field_column` reads it."""
    return f"_field{index}"


def _typed(fields: list[dict[str, Any]]) -> list[int]:
    """The indexes of the fields that are not strings: their checks read their variant type."""
    return [i for i, f in enumerate(fields) if _field_type(f)[0] != "string"]  # type: ignore[index]


def _type(index: int) -> str:
    """The column holding the variant type (`schema_of_variant`) of the non-string field
    `index`: a double's check reads it up to three times."""
    return f"_type{index}"


def _variant(index: int) -> str:
    """The column holding the string field `index` as a variant where it is not a string (absent,
    null or of another type; null where it is a string): looked up again only then, once."""
    return f"_variant{index}"


def _value(index: int) -> str:
    """The column holding the schema's field `index` as written (`_field_value`)."""
    return f"_value{index}"


def _time_field(topic: Topic) -> tuple[int, str] | None:
    """The schema field that is the event time field, if one is: its index and primitive."""
    spec = topic.event_time
    for index, field in enumerate((topic.user_schema or {})["fields"]):
        if spec is not None and field["name"] == spec.field:
            return index, _field_type(field)[0]  # type: ignore[index]
    return None


def _time_variant(topic: Topic) -> int | None:
    """The non-string schema field whose variant column (`_field<i>`) and variant type
    (`_type<i>`) are the event time's (epoch encodings), if one is."""
    found = _time_field(topic)
    return found[0] if found is not None and found[1] != "string" else None


def _time_path(topic: Topic) -> str:
    """The event time field as a variant (epoch encodings): a schema field's own column when it
    holds one."""
    spec = topic.event_time
    if spec is None or spec.encoding == "iso8601":
        return "CAST(NULL AS VARIANT)"
    field = _time_variant(topic)
    return _column(field) if field is not None else f"variant_get(_whole, '$[0].{spec.field}')"


def _time_value(topic: Topic) -> str:
    """The event time field as text (iso8601: null unless it is a string) or an integer (epoch
    encodings): a schema field's column when the field is one of that kind (its type check and
    the event time's reject the record where it is absent or null), else read from the
    document."""
    spec = topic.event_time
    if spec is None:
        return "CAST(NULL AS STRING)"
    field, kind = _time_field(topic) or (None, None)
    if spec.encoding == "iso8601":
        if kind == "string":
            return f"CAST({_column(field)} AS STRING)"  # type: ignore[arg-type]
        return f"CAST(try_variant_get(_whole, '$[0].{spec.field}', 'binary') AS STRING)"
    if kind in ("int", "long"):
        return f"CAST({_value(field)} AS BIGINT)"  # type: ignore[arg-type]
    return "try_variant_get(_time, '$', 'bigint')"


def _time_type(topic: Topic) -> str:
    """The variant type of `_time`: its schema field's `_type` column when it has one."""
    field = _time_variant(topic)
    return _type(field) if field is not None else "schema_of_variant(_time)"


def _event_time(topic: Topic) -> tuple[str, str]:
    """(epoch millis, its check) of the record's event time; null for processing time. The
    check reads `_event`, the named column of the millis, so they are computed once."""
    spec = topic.event_time
    if spec is None:
        return "CAST(NULL AS BIGINT)", "true"
    if spec.encoding == "iso8601":
        millis = "unix_millis(try_cast(_time_value AS TIMESTAMP))"
        check = f"_time_value RLIKE '{_ISO}'"  # null unless the field is a string
    else:
        scale = 1000 if spec.encoding == "epoch_seconds" else 1
        millis = f"try_multiply(_time_value, {scale})"
        low, high = -(-MIN_EVENT_MS // scale), MAX_EVENT_MS // scale
        check = f"{_time_type(topic)} IN {_INTEGERS} AND _time_value BETWEEN {low} AND {high}"
    return millis, f"{check} AND _event BETWEEN {MIN_EVENT_MS} AND {MAX_EVENT_MS}"
