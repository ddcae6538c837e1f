"""Input formats: how a topic's Kafka values become records, one module per format.

The topics file names a format (`format: json`); this registry maps that name to its class.
A new format (Protobuf, JSON Schema...) is one module subclassing `base.ParsingFormat` (or
`base.Format` for a backup-only one) and one line in `FORMATS`; its settings, if any, are the
topic entry's section named like it (`avro: {...}`), checked by its `Settings` model.
"""

from __future__ import annotations

import os
from json import loads  # (`json` here is the cairn.formats.json module)
from typing import Any

from cairn.formats.avro import AvroFormat
from cairn.formats.base import Format, ParsingFormat, Registries, Topic
from cairn.formats.json import JsonFormat
from cairn.formats.raw import RawFormat

FORMATS: dict[str, type[Format]] = {f.name: f for f in (JsonFormat, RawFormat, AvroFormat)}

REGISTRIES_VARIABLE = "CAIRN_SCHEMA_REGISTRIES"
"""Environment variable through which Spark jobs get `Registries` (JSON), never argv."""


def format_class(name: str) -> type[Format]:
    """The format called `name`; a ValueError listing the known ones otherwise."""
    found = FORMATS.get(name)
    if found is None:
        raise ValueError(f"unknown format {name!r}; expected one of {', '.join(sorted(FORMATS))}")
    return found


def open_format(topic: Topic, registries: Registries | None = None) -> ParsingFormat:
    """The parser of a topic whose format parses (not raw).

    `registries` maps Schema Registry connection ids to client configurations (see
    `cairn.formats.avro.registry_config`); formats that need none ignore it.
    """
    cls = format_class(topic.format)
    if not issubclass(cls, ParsingFormat):
        raise ValueError(f"{topic.label}: {topic.format} topics are backup only; nothing parses")
    return cls(topic, registries)


def registry_ids(topic: Topic) -> list[str]:
    """The Schema Registry connections a topic's format reads writer schemas from."""
    return format_class(topic.format).registry_ids(topic)


def registries_from_env() -> dict[str, dict[str, Any]]:
    """The `Registries` a Spark job was given in `REGISTRIES_VARIABLE` (none if unset)."""
    return loads(os.environ.get(REGISTRIES_VARIABLE) or "{}")
