"""JSON input: each Kafka value is one UTF-8 JSON object, mapped onto the topic's Avro schema.

Fields the schema does not name are dropped; schema fields the object lacks take their default
(or fail as missing). The event time is read from the JSON object itself, so its field need not
be in the schema. Whatever fastavro would refuse to write is refused here, with a reason that
names the field.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from typing import Any

from fastavro.validation import ValidationError, validate

from cairn.formats.base import (
    FieldError,
    KafkaCoords,
    Parsed,
    ParsingFormat,
    Reject,
    Topic,
    type_name,
)

_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_DEPTH = 999
"""JSON nested deeper than this many arrays and objects is refused: the JVM's parser takes no
deeper (`cairn.datafiles.fastpath`: Jackson's 1,000 levels, one of them its wrapper), and
Python's own limit, its recursion limit less the caller's stack, would let the same value parse in
an archive and fail in a rebuild of it."""
_SHALLOW = 200  # arrays and objects that fit under any caller's stack at Python's recursion limit
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings, skipped whole, and brackets


class JsonFormat(ParsingFormat):
    name = "json"

    @classmethod
    def check(cls, topic: Topic) -> None:
        if topic.event_time is not None and topic.event_time.encoding is None:
            raise FieldError(
                "event_time.encoding",
                "json topics name the encoding: epoch_seconds, epoch_millis or iso8601",
            )
        super().check(topic)

    def decode(
        self, value: bytes | bytearray | memoryview, coords: KafkaCoords, processing_time: datetime
    ) -> Parsed:
        try:
            text = str(value, "utf-8")
        except UnicodeDecodeError as err:
            raise Reject(f"invalid UTF-8 at byte {err.start}") from None
        try:
            obj = _loads(text)
        except (ValueError, RecursionError) as err:
            raise Reject(f"invalid JSON: {err}") from None
        if not isinstance(obj, dict):
            raise Reject(f"JSON value is {type_name(obj)}, not an object")
        filing = self.filing(obj, processing_time)

        schema = self.schema
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
        parsed = self.parsed(record, coords, filing)
        # The quick check first: with raise_errors=True fastavro builds an error object for every
        # union branch that does not match, even on valid records; only a misfit pays for the
        # reason.
        if not validate(record, schema, raise_errors=False):
            try:
                validate(record, schema, raise_errors=True)
            except ValidationError as err:
                raise Reject(_mismatch(err, schema["name"], missing)) from None
        if _ESCAPED_SURROGATE.search(text):
            try:
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise Reject("string with a lone UTF-16 surrogate cannot be written") from None
        return parsed


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
        f"field '{path}' does not fit the schema: got {type_name(first.datum)}, "
        f"expected {' or '.join(expected)}"
    )


def _avro_type(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return "union" if isinstance(schema, list) else str(schema)


def _loads(text: str) -> Any:
    """`json.loads`, to `MAX_DEPTH` whatever the caller's stack (deeper: a `Reject`). The
    brackets bound the depth, so only values with more than `MAX_DEPTH` of them are scanned."""
    brackets = text.count("[") + text.count("{")
    if brackets <= _SHALLOW:  # most values
        return json.loads(text, parse_constant=_reject_constant)
    if brackets > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        raise Reject(f"JSON nested deeper than {MAX_DEPTH} arrays and objects")
    limit = sys.getrecursionlimit()
    # room for the parser's recursion above this stack
    sys.setrecursionlimit(limit + min(brackets, MAX_DEPTH))
    try:
        return json.loads(text, parse_constant=_reject_constant)
    finally:
        sys.setrecursionlimit(limit)


def _depth(text: str) -> int:
    """How deeply the JSON text nests arrays and objects (of valid JSON; a bound otherwise)."""
    depth = deepest = 0
    for token in _TOKENS.finditer(text):
        bracket = token.group()
        if bracket in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif bracket in ("]", "}"):
            depth -= 1
    return deepest


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")
