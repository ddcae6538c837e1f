"""Avro input: values in Avro binary, read with the writer's schema and resolved to the topic's.

Two framings (`avro.framing`):
- `confluent` (default): the Confluent wire format, a magic byte 0, the writer schema's id
  (4 bytes, big-endian), then the Avro binary. Writer schemas come by id from a Schema Registry
  named by an Airflow connection (`avro.registry`), or, air-gapped, from a folder of `.avsc`
  files (`avro.schemas_dir`) laid out as `<subject>/<version>-<id>.avsc`.
- `plain`: Avro binary only, all written with one fixed writer schema (`avro.writer_schema`).

The topic's `schema:` is the reader schema: Avro schema resolution maps every writer version
onto it (fields added with defaults, fields removed, promoted types), so the partitioned files
hold one schema whatever the producers wrote. A value whose schema id is unknown, whose bytes do
not decode, or whose writer schema does not resolve to the reader schema is quarantined with the
reason; a Schema Registry that cannot be reached fails the run instead (a retry can succeed).
Writer schemas are looked up once per id and kept (at most `CACHED_WRITERS` of them).
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal, NamedTuple, Protocol, cast

import fastavro
from fastavro.read import SchemaResolutionError
from pydantic import BaseModel, ConfigDict, model_validator

from cairn.formats.base import (
    FieldError,
    KafkaCoords,
    Parsed,
    ParsingFormat,
    Registries,
    Reject,
    Topic,
    load_schema,
    parsed_record_schema,
)

CACHED_WRITERS = 1024
"""Writer schemas (known or unknown ids) kept per writer: enough for any real topic, and a
bound on memory when garbage bytes carry random ids."""

_HEADER = 5  # magic byte + 4-byte schema id
_SCHEMA_FILE_RE = re.compile(r"(?P<version>[1-9][0-9]*)-(?P<id>[0-9]+)\.avsc")
_CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")


class Resolution(NamedTuple):
    """How to read values of one writer schema: with it, resolved to `reader` (None: the
    writer schema is the reader schema)."""

    writer: dict[str, Any]
    reader: dict[str, Any] | None


class AvroSettings(BaseModel):
    """The `avro:` section of a topic entry; paths are relative to the topics file."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    framing: Literal["confluent", "plain"] = "confluent"
    """confluent: a magic byte and the writer schema's id before each value; plain: Avro only."""
    registry: str | None = None
    """confluent: the Airflow connection id of a Confluent-compatible Schema Registry."""
    schemas_dir: str | None = None
    """confluent, air-gapped: a folder of <subject>/<version>-<id>.avsc writer schemas."""
    writer_schema: str | None = None
    """plain: the one writer schema (.avsc) every value was written with."""

    @model_validator(mode="after")
    def _consistent(self) -> AvroSettings:
        if self.framing == "plain":
            if self.writer_schema is None:
                raise ValueError("framing: plain needs writer_schema (an .avsc file)")
            if self.registry is not None or self.schemas_dir is not None:
                raise ValueError("framing: plain reads no schema ids; drop registry/schemas_dir")
            return self
        if self.writer_schema is not None:
            raise ValueError("writer_schema is for framing: plain; confluent values carry ids")
        if (self.registry is None) == (self.schemas_dir is None):
            raise ValueError("give exactly one of registry (a connection id) or schemas_dir")
        if self.registry is not None and not _CONN_ID_RE.fullmatch(self.registry):
            raise ValueError(f"registry {self.registry!r} is not an Airflow connection id")
        return self


class RegistryUnavailable(RuntimeError):
    """The Schema Registry did not answer a lookup: the run fails (and is retried) rather than
    quarantine records whose schema it could not see."""


class WriterSchemas(Protocol):
    """Where writer schemas come from, by their registry id."""

    def by_id(self, schema_id: int) -> dict[str, Any] | None:
        """The parsed writer schema with this id; None when there is none."""


class SchemaFolder:
    """Writer schemas from files, for setups without a reachable registry.

    Layout: `<dir>/<subject>/<version>-<id>.avsc`, e.g. `payments-value/3-1042.avsc` is version
    3 of subject `payments-value`, registered with id 1042 (the id the producers' values carry).
    It is what a registry export gives: `GET /subjects/<s>/versions/<v>` returns all three.
    The files are read through the topic, so they travel with its entry to Spark jobs.
    """

    def __init__(self, topic: Topic, folder: str) -> None:
        if not _has_folder(topic, folder):
            raise ValueError(f"schemas_dir {topic.base_dir / folder} is not a folder")
        self.topic = topic
        self.paths: dict[int, str] = {}
        for name in schema_files(topic, folder):
            found = _SCHEMA_FILE_RE.fullmatch(PurePosixPath(name).name)
            if found is None:
                raise ValueError(f"{name}: name writer schemas <subject>/<version>-<id>.avsc")
            schema_id = int(found["id"])
            if schema_id in self.paths:
                raise ValueError(f"{name}: schema id {schema_id} also in {self.paths[schema_id]}")
            self.paths[schema_id] = name

    def by_id(self, schema_id: int) -> dict[str, Any] | None:
        name = self.paths.get(schema_id)
        if name is None:
            return None
        return parsed_record_schema(_load(self.topic, name))


def schema_files(topic: Topic, folder: str) -> list[str]:
    """The writer schema files of a `schemas_dir`, relative to the topics file."""
    return topic.file_names(folder, "*/*.avsc")


def _has_folder(topic: Topic, folder: str) -> bool:
    """Whether the `schemas_dir` exists: on disk, or in the snapshot the entry travelled with."""
    return (topic.base_dir / folder).is_dir() or bool(schema_files(topic, folder))


class SchemaRegistry:
    """Writer schemas from a Confluent-compatible Schema Registry (`SchemaRegistryClient`).

    `config` is the client's configuration (`registry_config` builds it from a connection);
    a `mock://` URL gets the client library's in-memory registry (tests). The client caches
    what it fetched; schema references are resolved through their subjects and versions.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient  # only avro topics

        self.url = config.get("url")
        self.client = SchemaRegistryClient.new_client(dict(config))

    def by_id(self, schema_id: int) -> dict[str, Any] | None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self.client.get_schema(schema_id)
            refs = [
                self.client.get_version(r.subject, r.version)  # type: ignore[arg-type]  # both set
                for r in schema.references or ()
            ]
        except SchemaRegistryError as err:
            if err.http_status_code == 404:
                return None
            raise RegistryUnavailable(f"Schema Registry {self.url}: id {schema_id}: {err}") from err
        except Exception as err:  # unreachable, refused, timed out: the run fails, retried
            message = f"Schema Registry {self.url}: id {schema_id}: {type(err).__name__}: {err}"
            raise RegistryUnavailable(message) from err
        if (schema.schema_type or "AVRO") != "AVRO":
            raise Reject(f"writer schema id {schema_id} is {schema.schema_type}, not Avro")
        named: dict[str, Any] = {}
        try:
            for ref in refs:
                fastavro.parse_schema(json.loads(ref.schema.schema_str or ""), named_schemas=named)
            return parsed_record_schema(json.loads(schema.schema_str or ""), named_schemas=named)
        except Exception as err:  # the registry's schema itself: its records cannot be read
            raise Reject(f"writer schema id {schema_id} does not parse: {err}") from None


def registry_config(
    host: str,
    port: int | None,
    login: str | None,
    password: str | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """A `SchemaRegistryClient` configuration from an Airflow connection's parts.

    `host` is the registry's URL or host name (http unless it names a scheme), `port` is added
    when given, login and password are the basic-auth user, and the extra holds any further
    client setting (`ssl.ca.location`, `timeout`, `bearer.auth.*`...).
    """
    url = host if "://" in host else f"http://{host}"
    if port:
        url = f"{url.rstrip('/')}:{port}"
    config = {**extra, "url": url}
    if login:
        config["basic.auth.user.info"] = f"{login}:{password or ''}"
    return config


class AvroFormat(ParsingFormat):
    name = "avro"
    Settings = AvroSettings
    decodes_timestamps = True

    @classmethod
    def check(cls, topic: Topic) -> None:
        super().check(topic)
        settings = _settings(topic)
        try:
            if settings.writer_schema is not None:
                _load(topic, settings.writer_schema)
            if settings.schemas_dir is not None:
                SchemaFolder(topic, settings.schemas_dir)
        except ValueError as err:  # load_schema and SchemaFolder name the file
            field = "avro.writer_schema" if settings.writer_schema else "avro.schemas_dir"
            raise FieldError(field, str(err)) from None

    @classmethod
    def registry_ids(cls, topic: Topic) -> list[str]:
        registry = _settings(topic).registry
        return [] if registry is None else [registry]

    @classmethod
    def files(cls, topic: Topic) -> list[str]:
        settings = _settings(topic)
        if settings.writer_schema is not None:
            return [settings.writer_schema]
        return [] if settings.schemas_dir is None else schema_files(topic, settings.schemas_dir)

    def __init__(self, topic: Topic, registries: Registries | None = None) -> None:
        """`registries` maps a registry connection id to its `SchemaRegistryClient` config;
        only topics with `avro.registry` need theirs in it."""
        super().__init__(topic, registries)
        settings = _settings(topic)
        self.reader = parsed_record_schema(topic.user_schema or {})
        self.fixed: Resolution | None = None  # framing: plain
        self.schemas: WriterSchemas | None = None  # framing: confluent
        if settings.writer_schema is not None:
            writer = _load(topic, settings.writer_schema)
            self.fixed = self._resolution(parsed_record_schema(writer))
            return
        if settings.schemas_dir is not None:
            self.schemas = SchemaFolder(topic, settings.schemas_dir)
        else:
            config = (registries or {}).get(settings.registry or "")
            if config is None:
                raise LookupError(
                    f"{topic.label}: no configuration for Schema Registry connection "
                    f"{settings.registry!r} was given to the writer"
                )
            self.schemas = SchemaRegistry(config)
        self.writer_by_id = functools.lru_cache(maxsize=CACHED_WRITERS)(self._by_id)

    def decode(
        self, value: bytes | bytearray | memoryview, coords: KafkaCoords, processing_time: datetime
    ) -> Parsed:
        data = bytes(value)
        found: Resolution | None
        if self.fixed is not None:
            found, start, label = self.fixed, 0, "the writer_schema"
        else:
            if len(data) < _HEADER:
                raise Reject(f"{len(data)} bytes, shorter than the Confluent header (5 bytes)")
            if data[0] != 0:
                raise Reject(f"not Confluent-framed: magic byte {data[0]}, expected 0")
            schema_id = int.from_bytes(data[1:_HEADER], "big")
            found, start = self.writer_by_id(schema_id), _HEADER
            label = f"writer schema id {schema_id}"
            if found is None:
                raise Reject(f"unknown writer schema id {schema_id}")
        fo = io.BytesIO(data)
        fo.seek(start)
        try:
            record = cast(
                dict[str, Any], fastavro.schemaless_reader(fo, found.writer, found.reader)
            )
        except SchemaResolutionError as err:
            raise Reject(f"{label} does not resolve to the reader schema: {err}") from None
        except EOFError:
            raise Reject(f"not Avro of {label}: the value ends early") from None
        except Exception as err:  # content never raises: any decoding failure is the record's
            raise Reject(f"not Avro of {label}: {type(err).__name__}: {err}") from None
        if fo.tell() != len(data):
            raise Reject(f"{len(data) - fo.tell()} bytes left after the Avro value ({label})")
        return self.parsed(record, coords, self.filing(record, processing_time))

    def _by_id(self, schema_id: int) -> Resolution | None:
        assert self.schemas is not None
        writer = self.schemas.by_id(schema_id)
        return None if writer is None else self._resolution(writer)

    def _resolution(self, writer: dict[str, Any]) -> Resolution:
        """Compared once per writer schema: fastavro would compare them for every value."""
        return Resolution(writer, None if writer == self.reader else self.reader)


def _load(topic: Topic, relative: str) -> dict[str, Any]:
    """A schema file the entry names, read through the topic (`load_schema` checks it)."""
    try:
        data = topic.read_file(relative)
    except OSError as err:
        raise ValueError(f"schema {topic.base_dir / relative}: {err}") from None
    return load_schema(topic.base_dir / relative, data)


def _settings(topic: Topic) -> AvroSettings:
    settings = topic.format_settings
    assert isinstance(settings, AvroSettings), "validated with the topic entry"
    return settings
