"""A topic's configuration: one entry of the topics file, validated with pydantic.

`TopicConfig` is the model every part of Cairn reads; its fields' docstrings are the reference
(`python -m cairn config-reference`). Where the entries come from, how a mistake in one is
located and contained, and how pattern entries become topics is `cairn.topics_file`.
"""

from __future__ import annotations

import re
from datetime import date, timedelta, tzinfo
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from cairn.dag_ids import check_dag_topic
from cairn.formats import FORMATS, format_class
from cairn.formats.base import EventTime, FieldError, load_schema
from cairn.schedule import completion_cron, spread
from cairn.storage.layout import DEFAULT_PATH_FORMAT, check_path_format, date_folder

REPO = Path(__file__).resolve().parents[2]
INCLUDE_DIR = REPO / "include"
DEFAULT_ARCHIVE_ROOT = (REPO / ".cairn" / "archive").as_uri()

# Airflow's presets; anything else must be a five-field cron expression.
SCHEDULE_PRESETS = {
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
    "@annually",
}

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")


class ArchiveRoot(NamedTuple):
    scheme: Literal["file", "s3"]
    conn_id: str | None  # Airflow connection holding the S3 endpoint and credentials
    bucket: str | None
    prefix: str  # absolute directory for file://, key prefix (no slashes around it) for s3://

    @property
    def storage_url(self) -> str:
        """The URL `cairn.storage.objects.Storage` takes (credentials come from the connection)."""
        if self.scheme == "file":
            return f"file://{self.prefix}"
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_archive_root(url: str) -> ArchiveRoot:
    """Split `file:///abs/path` or `s3://<conn_id>@<bucket>/<prefix>`; reject anything else."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"archive root {url!r}: no query or fragment allowed")
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"archive root {url!r}: '.' and '..' are not allowed")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"archive root {url!r}: use file:///absolute/path")
        if not segments:
            raise ValueError(f"archive root {url!r}: refusing the filesystem root")
        return ArchiveRoot("file", None, None, "/" + "/".join(segments))
    if parts.scheme == "s3":
        conn_id, at, bucket = parts.netloc.rpartition("@")
        if not at or not _CONN_ID_RE.fullmatch(conn_id):
            raise ValueError(
                f"archive root {url!r}: name the Airflow connection, s3://<conn_id>@<bucket>/<prefix>"
            )
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise ValueError(f"archive root {url!r}: {bucket!r} is not a valid S3 bucket name")
        return ArchiveRoot("s3", conn_id, bucket, "/".join(segments))
    raise ValueError(
        f"archive root {url!r}: expected file:///abs/path or s3://<conn_id>@<bucket>/<prefix>"
    )


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """'90', '90s', '30m', '2h', '1d' as a timedelta (a bare number is seconds)."""
    found = _DURATION_RE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a duration; write seconds or e.g. '30m', '2h', '1d'")
    return timedelta(seconds=float(found[1]) * _DURATION_UNITS[found[2] or "s"])


class TopicConfig(BaseModel):
    """One entry of topics.yaml (after `defaults` are merged in).

    `codec` defaults to deflate: the Avro spec requires every implementation to support it, and
    fastavro (stdlib zlib), Spark and avro-tools read it with no native library. snappy and
    zstandard need extra native packages on every writer and reader, the codec trouble that
    users of Secor and Kafka Connect ran into.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, serialize_by_alias=True, use_attribute_docstrings=True
    )
    # Each field's docstring is its description in `python -m cairn config-reference`.

    topic: str | None = None
    """The Kafka topic this entry archives (give `topic` or `pattern`)."""
    pattern: str | None = None
    """A regex matching whole topic names, each archived alike; internal `__` topics never match.
    A topic entry wins over patterns; a topic two patterns match is an error. Kafka is asked for
    new matches every 5 minutes."""
    format: str
    """How values are parsed: json, avro, or raw (verbatim backup only)."""
    event_time: EventTime | None = None
    """Where each record's event time is: {field: dotted.path, encoding: ...}."""
    time_source: Literal["event", "processing"] = "event"
    """processing: file records by the time they are archived instead of an event time."""
    schema_file: str | None = Field(default=None, alias="schema")
    """The Avro record schema (.avsc, relative to the topics file) of the partitioned files; for
    avro topics the reader schema every writer schema resolves to."""
    path_format: str = DEFAULT_PATH_FORMAT
    """The partitioned files' folders, strftime of the event time; Hive-style key=value."""
    timezone: str = "UTC"
    """IANA timezone the folders are rendered in."""
    generation: int = Field(default=1, ge=1)
    """Output generation, in every file name: bump it for an incompatible output change."""
    max_records_per_partition: int = Field(default=500_000, gt=0)
    """A run reads at most this many records per Kafka partition; the rest wait for the next."""
    run_on: Literal["records", "schedule"] = "records"
    """records: the archive DAG runs when records wait (min_records, max_delay), watched in
    Airflow's triggerer, and daily to complete an idle topic's dates; schedule: it runs on
    `schedule`, whether or not records wait (the default when the entry gives a schedule or
    turns commit_consumer_group off)."""
    max_delay: timedelta = timedelta(minutes=10)
    """run_on records: run once the oldest waiting record has waited this long (30s, 10m)."""
    min_records: int = Field(default=100_000, gt=0)
    """run_on records: run at once when this many records wait, however new."""
    schedule: str = "*/10 * * * *"
    """run_on schedule: when the archive DAG runs, a 5-field cron or an Airflow preset such as
    @hourly."""
    spread_schedule: bool = True
    """Run at a minute fixed by the topic's name inside the schedule's interval (*/10 becomes
    e.g. 7-59/10), so many topics do not start together; other crons are kept as written."""
    archive_root: str = DEFAULT_ARCHIVE_ROOT
    """Where the archive lives: file:///abs/path or s3://<conn_id>@<bucket>/<prefix>."""
    codec: Literal["deflate", "snappy", "zstandard", "null"] = "deflate"
    """Avro codec; deflate needs no native library in any reader."""
    new_partition_start: Literal["earliest", "latest"] = "earliest"
    """Where the first run starts reading: Kafka's first offset or its end."""
    accept_gaps: bool = False
    """true: records Kafka deleted before they were archived are recorded as a gap, not fatal."""
    consumer_group: str | None = None
    """The Kafka consumer group each commit gives the token's offsets (null: cairn.<topic>), so
    lag tools (kafka-consumer-groups, Burrow) see Cairn like a consumer."""
    commit_consumer_group: bool = True
    """false: leave the consumer group alone (a changed root is then caught only by the root
    Airflow remembers from the topic's last commit)."""
    start_new_archive: bool = False
    """Start a new archive at archive_root although a witness (the consumer group, the root of
    the topic's last commit) shows the topic was archived elsewhere; without it such a first run
    is refused as a changed or mistyped root. Remove it after that run."""
    max_time_lag: timedelta = timedelta(hours=1)
    """Alert when the oldest record not yet archived is older than this (30m, 2h, 1d, seconds)."""
    max_freshness: timedelta | None = None
    """Alert when the p95 of how long records waited from Kafka to the archive over the last
    hour is past this; null: 3 x max_delay (at least 15m) for run_on records, none for schedule."""
    max_quarantine_ratio: float = Field(default=0.01, ge=0, le=1)
    """Alert when more than this share of the recent runs' records went to quarantine."""
    max_run_duration: timedelta = timedelta(hours=1)
    """Report a run still unfinished this long after it was queued (an Airflow Deadline Alert)."""
    spark_timeout: timedelta = timedelta(minutes=30)
    """Kill a Spark job attempt (archive, rebuild, seal) running longer, at least 1m; it is
    retried afresh. Safe at any moment: an attempt writes only its own staging until it commits."""
    attempt_timeout: timedelta = timedelta(days=1)
    """The longest an attempt (an archive run, a rebuild, a seal) may take from its plan to its
    commit, retries and waits for a Spark slot included; one that takes longer is refused at its
    commit, and what it left is removed by the next runs. Longer than spark_timeout."""
    spark_connection: str | None = None
    """The Airflow connection of the Spark that runs this topic's jobs (spark_connect or spark);
    null: the deployment's, CAIRN_SPARK_CONN_ID (cairn_spark)."""
    share_spark_job: bool = True
    """On a spark_connect connection, archive runs ready at about the same moment share one
    Spark job, each keeping its own run, attempt and token (a retried run gets a job of its
    own); false: every run of this topic gets a job of its own."""
    lateness: timedelta | None = timedelta(hours=1)
    """How long after a date ends (Kafka time) its records may still arrive; then the date is
    complete (_SUCCESS, the asset event cairn.<topic>). null: no completeness."""
    seal: bool = True
    """Seal each complete date: few large files, its partition of the Iceberg table, a proof."""
    seal_target_file_mb: int = Field(default=128, gt=0)
    """A sealed file's size: at most one file per event-time folder per this many MB."""
    reseal_files: int = Field(default=10, gt=0)
    """Seal a sealed date again once this many of its files are not sealed (late records)..."""
    reseal_mb: int = Field(default=64, gt=0)
    """... or once they hold this many MB."""
    table_snapshot_age: timedelta = timedelta(days=7)
    """How long the table's snapshots stay for time travel: at each seal, older ones are
    expired, with the files only they referenced, and a proof whose snapshot went says so."""
    format_settings: Any = Field(default=None, validate_default=True)
    """The format's own section, named after it (avro: {...})."""

    # Directory `schema` is relative to: that of the topics file (include/ by default).
    _base_dir: Path = PrivateAttr(default=INCLUDE_DIR)
    # Where the entry is written (set by `cairn.topics_file`), so errors can point at it.
    _file: str = PrivateAttr(default="")
    _line: int | None = PrivateAttr(default=None)
    # The files the entry names, when it travelled to a Spark job (`TopicSnapshot`): then they
    # are read from here, never from the disk of a machine that has no topics file.
    _files: dict[str, str] | None = PrivateAttr(default=None)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return None if value is None else check_dag_topic(value)

    @model_validator(mode="before")
    @classmethod
    def _scheduled(cls, data: Any) -> Any:
        """An entry (or its defaults) that gives a `schedule`, or turns `commit_consumer_group`
        off, and gives no `run_on` runs on its schedule, as every topic did before `run_on`."""
        if not isinstance(data, dict) or "run_on" in data:
            return data
        if "schedule" in data or data.get("commit_consumer_group") is False:
            return {**data, "run_on": "schedule"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _format_section(cls, data: Any) -> Any:
        """The entry's section named like its format holds that format's settings."""
        if isinstance(data, dict) and "format_settings" in data:
            raise FieldError("format_settings", "unknown key; a format's section is named after it")
        if isinstance(data, dict) and data.get("format") in FORMATS and data["format"] in data:
            data = dict(data)
            data["format_settings"] = data.pop(data["format"])
        return data

    @model_serializer(mode="wrap")
    def _format_section_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumped as written: the settings under the format's name, so a dump loads again."""
        data = handler(self)
        settings = data.pop("format_settings", None)
        if settings is not None:
            data[self.format] = settings
        return data

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        format_class(value)
        return value

    @field_validator("format_settings")
    @classmethod
    def _format_settings(cls, value: Any, info: ValidationInfo) -> BaseModel | None:
        name = info.data.get("format")
        if name is None:  # the format itself was refused
            return None
        model = FORMATS[name].Settings
        if model is None:
            if value is not None:
                raise FieldError(name, f"{name} topics take no '{name}' section")
            return None
        if isinstance(value, model):
            return value
        try:
            return model.model_validate(value or {})
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            where = ".".join([name, *map(str, first["loc"])])
            cause = (first.get("ctx") or {}).get("error")
            raise FieldError(where, str(cause) if cause else first["msg"]) from None

    @field_validator(
        "max_time_lag",
        "max_run_duration",
        "spark_timeout",
        "attempt_timeout",
        "table_snapshot_age",
        "max_delay",
        "max_freshness",
        mode="before",
    )
    @classmethod
    def _max_time_lag(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.startswith("P"):  # ISO 8601 as pydantic reads it
            return parse_duration(value)
        return value

    @field_validator("lateness", mode="before")
    @classmethod
    def _lateness(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.startswith("P"):
            return parse_duration(value)
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"invalid regular expression: {err}") from None
        return value

    @field_validator("path_format")
    @classmethod
    def _path_format(cls, value: str) -> str:
        return check_path_format(value)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA timezone {value!r}") from None
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        from croniter import croniter  # only where entries are read, not on Spark's executors

        if value in SCHEDULE_PRESETS:
            return value
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(f"{value!r} is neither a 5-field cron expression nor a preset")
        return value

    @field_validator("archive_root")
    @classmethod
    def _archive_root(cls, value: str) -> str:
        parse_archive_root(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TopicConfig:
        if (self.topic is None) == (self.pattern is None):
            raise FieldError("topic", "give exactly one of 'topic' or 'pattern'")
        return self

    @field_validator("spark_timeout")
    @classmethod
    def _spark_timeout(cls, value: timedelta) -> timedelta:
        if value < timedelta(minutes=1):
            raise ValueError("must be at least 1m: Spark alone takes seconds to start")
        return value

    @model_validator(mode="after")
    def _attempt_timeout(self) -> TopicConfig:
        if self.attempt_timeout <= self.spark_timeout:
            raise FieldError(
                "attempt_timeout",
                f"must be longer than spark_timeout ({self.spark_timeout}): an attempt runs its "
                "Spark job and then commits",
            )
        return self

    @model_validator(mode="after")
    def _run_on(self) -> TopicConfig:
        if self.run_on == "records" and not self.commit_consumer_group:
            raise FieldError(
                "run_on",
                "records needs commit_consumer_group: the triggerer reads the archived position "
                "from the consumer group; set run_on: schedule",
            )
        if self.max_delay < timedelta(seconds=1):
            raise FieldError("max_delay", "must be at least 1s")
        return self

    @model_validator(mode="after")
    def _completeness(self) -> TopicConfig:
        if self.lateness is not None and self.lateness < timedelta(0):
            raise FieldError("lateness", "must not be negative")
        if self.tracks_completeness and date_folder(self.path_format, date(2000, 1, 1)) is None:
            raise FieldError(
                "path_format",
                "completeness needs the date (%Y %m %d) in the leading folders, before %H and "
                "%M, so each date has one folder for its _SUCCESS marker; or set lateness: null",
            )
        return self

    @property
    def tracks_completeness(self) -> bool:
        """Whether Cairn marks this topic's complete dates (formats that parse, with lateness)."""
        return self.lateness is not None and FORMATS[self.format].parses

    @property
    def seals(self) -> bool:
        """Whether Cairn seals this topic's complete dates."""
        return self.seal and self.tracks_completeness

    @property
    def archive_schedule(self) -> str:
        """The archive DAG's schedule: `schedule`, spread by topic unless `spread_schedule` is
        off (`cairn.schedule.spread`)."""
        if self.spread_schedule and self.topic is not None:
            return spread(self.schedule, self.topic)
        return self.schedule

    @property
    def freshness_limit(self) -> timedelta | None:
        """The p95 freshness past which the topic alerts (`max_freshness`), or None."""
        if self.max_freshness is not None or self.run_on == "schedule":
            return self.max_freshness
        return max(3 * self.max_delay, timedelta(minutes=15))

    @property
    def completion_schedule(self) -> str | None:
        """run_on records: the daily cron of the run that completes an idle topic's dates
        (`cairn.schedule.completion_cron`); None without completeness."""
        if self.lateness is None or self.topic is None:
            return None
        return completion_cron(self.topic, -(-self.lateness // timedelta(minutes=1)))

    @property
    def topic_name(self) -> str:
        """The topic of an entry resolved to one (`topics_file` resolves patterns before anything
        runs); a ValueError for a pattern's entry, which names no topic."""
        if self.topic is None:
            raise ValueError(f"{self.label}: resolve the pattern to a topic first")
        return self.topic

    @property
    def label(self) -> str:
        """How errors and logs refer to this entry."""
        return f"topic {self.topic!r}" if self.topic else f"pattern {self.pattern!r}"

    @property
    def written_at(self) -> str:
        """Where the entry is written, 'file, line N' (empty when it was not read from a file)."""
        return self._file + (f", line {self._line}" if self._line else "")

    @property
    def group_id(self) -> str:
        """The consumer group the token's offsets are committed to."""
        return self.consumer_group or f"cairn.{self.topic}"

    @property
    def parses(self) -> bool:
        """Whether the format parses (partitioned and quarantine output), or is backup only."""
        return FORMATS[self.format].parses

    @property
    def tzinfo(self) -> tzinfo:
        return ZoneInfo(self.timezone)

    @property
    def root(self) -> ArchiveRoot:
        return parse_archive_root(self.archive_root)

    @property
    def base_dir(self) -> Path:
        """The folder relative paths of the entry (`schema`, format files) start from."""
        return self._base_dir

    @property
    def schema_path(self) -> Path | None:
        return None if self.schema_file is None else self._base_dir / self.schema_file

    @cached_property
    def user_schema(self) -> dict[str, Any] | None:
        """The topic's Avro record schema, read once (None for raw topics)."""
        if self.schema_file is None or self.schema_path is None:
            return None
        return load_schema(self.schema_path, self._read(self.schema_file))

    def read_file(self, relative: str) -> bytes:
        """A file the entry names (relative to the topics file): from the snapshot the entry
        travelled with, else from disk."""
        found = self._read(relative)
        return (self._base_dir / relative).read_bytes() if found is None else found

    def file_names(self, folder: str, pattern: str) -> list[str]:
        """The files in `folder` (relative to the topics file) that match the glob `pattern`
        (`*/*.avsc`), relative to the topics file, sorted."""
        if self._files is not None:
            below = [name for name in self._files if name.startswith(f"{folder.rstrip('/')}/")]
            return sorted(n for n in below if PurePosixPath(n).match(f"{folder}/{pattern}"))
        base = self._base_dir
        return sorted(p.relative_to(base).as_posix() for p in (base / folder).glob(pattern))

    def _read(self, relative: str) -> bytes | None:
        """The snapshot's copy of a file the entry names; None when the entry was read from a
        topics file (read the disk)."""
        if self._files is None:
            return None
        if relative not in self._files:
            raise FileNotFoundError(f"{self.label}: {relative} did not travel with the entry")
        return self._files[relative].encode()

    def snapshot(self) -> TopicSnapshot:
        """The entry as it travels to a Spark job: its settings and the files it names."""
        names = [self.schema_file] if self.schema_file else []
        names += FORMATS[self.format].files(self)
        return TopicSnapshot(
            entry=self.model_dump(mode="json", exclude_none=True),
            files={name: self.read_file(name).decode() for name in names},
            written_at=self.written_at,
        )

    def matches(self, topic: str) -> bool:
        """Whether this entry covers `topic`; patterns never match internal `__` topics."""
        if self.topic is not None:
            return topic == self.topic
        return not topic.startswith("__") and re.fullmatch(self.pattern or "", topic) is not None


class TopicSnapshot(BaseModel):
    """A topic's entry as a Spark job gets it (`TopicConfig.snapshot`): the entry with its
    defaults merged in and the files it names (schemas), so the job's driver and executors read
    nothing from the disk of the machine that holds the topics file."""

    model_config = ConfigDict(frozen=True)

    entry: dict[str, Any]
    files: dict[str, str]
    """The named files' text, by the path the entry gives (relative to its topics file)."""
    written_at: str
    """Where the entry is written, for errors."""

    def topic(self) -> TopicConfig:
        """The entry again, its files read from this snapshot."""
        cfg = TopicConfig.model_validate(self.entry)
        cfg._files, cfg._file = dict(self.files), self.written_at
        FORMATS[cfg.format].check(cfg)
        return cfg
