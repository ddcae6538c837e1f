"""Deterministic object names under an archive root, Secor style.

A record's Kafka coordinates name the file that holds it: every data file is
`<gen>_<partition>_<first offset, 20 digits>.avro`, so a re-read of the same range writes the same
name (never a second copy) and cleanup can tell from a name alone which attempt wrote it.
`parse_data_key` inverts the builders; anything it does not recognise is not Cairn's data.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import date, datetime, time, tzinfo
from itertools import takewhile
from typing import Literal

DataKind = Literal["backup", "partitioned", "quarantine"]
DATA_KINDS: tuple[DataKind, ...] = ("backup", "partitioned", "quarantine")

DEFAULT_PATH_FORMAT = "dt=%Y-%m-%d/hr=%H"
SUCCESS_MARKER = "_SUCCESS"
"""A complete date's marker, in its date folder; readers skip `_` files, parse_data_key too."""

# Kafka's own rule for topic names (plus its ban on "." and ".."): these are path-safe.
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_SAFE_ID_RE = re.compile(r"[a-zA-Z0-9._-]{1,200}")
_FILE_RE = re.compile(r"(\d+)_(\d+)_(\d{20})\.avro")
_SEALED_RE = re.compile(r"(\d+)_sealed_(\d{6})\.avro")
_LINK_RE = re.compile(r"(\d{12})\.json")
_CLAIM_RE = re.compile(r"(\d{12})-(\d{6})\.json")
_HIVE_KEY_RE = re.compile(r"[a-z_][a-z0-9_]*")
_FORMAT_VALUE_RE = re.compile(r"(?:%[YmdHM]|[A-Za-z0-9_-])+")
_MAX_OFFSET = 10**20 - 1


def check_topic(topic: str) -> str:
    """Return `topic` if it is a legal Kafka topic name (and so safe as one path segment)."""
    if not _is_topic(topic):
        raise ValueError(f"invalid Kafka topic name {topic!r}: expected [a-zA-Z0-9._-]{{1,249}}")
    return topic


def data_file_name(gen: int, partition: int, first_offset: int) -> str:
    if gen < 1 or partition < 0 or not 0 <= first_offset <= _MAX_OFFSET:
        raise ValueError(f"bad coordinates gen={gen} partition={partition} offset={first_offset}")
    return f"{gen}_{partition}_{first_offset:020d}.avro"


def sealed_file_name(gen: int, chunk: int) -> str:
    """A sealed file: chunk `chunk` of one folder's records, merged when its date was sealed."""
    if gen < 1 or not 0 <= chunk < 10**6:
        raise ValueError(f"bad sealed file gen={gen} chunk={chunk}")
    return f"{gen}_sealed_{chunk:06d}.avro"


def backup_folder(topic: str, partition: int | None = None) -> str:
    """`backup/<topic>/`, or one partition's folder in it."""
    base = f"backup/{check_topic(topic)}/"
    return base if partition is None else f"{base}partition={partition}/"


def backup_partition(folder: str) -> int | None:
    """The partition of a backup partition folder's key (`.../partition=3/`), else None."""
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    if name.startswith("partition=") and name[10:].isdigit():
        return int(name[10:])
    return None


def backup_key(topic: str, gen: int, partition: int, first_offset: int) -> str:
    name = data_file_name(gen, partition, first_offset)
    return f"backup/{check_topic(topic)}/partition={partition}/{name}"


def partitioned_key(topic: str, gen: int, partition: int, first_offset: int, folder: str) -> str:
    if not is_safe_folder(folder):
        raise ValueError(f"unsafe partition folder {folder!r}")
    name = data_file_name(gen, partition, first_offset)
    return f"partitioned/{check_topic(topic)}/{folder}/{name}"


QUARANTINE_FORMAT = "dt=%Y-%m-%d"
"""Quarantine folders are by processing date, whatever the topic's path format."""


def quarantine_folder(processing_date: date) -> str:
    return processing_date.strftime(QUARANTINE_FORMAT)


def quarantine_key(
    topic: str, gen: int, partition: int, first_offset: int, processing_date: date
) -> str:
    name = data_file_name(gen, partition, first_offset)
    return f"quarantine/{check_topic(topic)}/{quarantine_folder(processing_date)}/{name}"


def kind_folder(kind: DataKind, topic: str, folder: str = "") -> str:
    """`<kind>/<topic>/` (or one folder in it, with a trailing `/`)."""
    base = f"{kind}/{check_topic(topic)}/"
    return f"{base}{folder.strip('/')}/" if folder else base


def day_prefixes(topic: str, path_format: str, day: date) -> tuple[str, str]:
    """What to list for `day`: the partitioned prefix its date alone fixes (`dt=2024-06-01/`,
    or the topic's whole folder for a format whose leading folders do not fix the date) and its
    quarantine folder."""
    return (
        kind_folder("partitioned", topic) + date_prefix(path_format, day),
        kind_folder("quarantine", topic, quarantine_folder(day)),
    )


def file_date(f: DataFile, path_format: str) -> date | None:
    """The date a data file is filed under (partitioned: its event-time folder's; quarantine:
    the processing date); None for backup files and folders of another path format."""
    if f.kind == "backup":
        return None
    try:
        return folder_date(f.folder, QUARANTINE_FORMAT if f.kind == "quarantine" else path_format)
    except ValueError:
        return None


def data_prefixes(topic: str) -> list[str]:
    """The prefixes holding `topic`'s data files (what cleanup lists)."""
    return [f"{kind}/{check_topic(topic)}/" for kind in DATA_KINDS]


def chain_folder(topic: str) -> str:
    """Where a topic's tokens live: every commit is one (`cairn.protocol.tokens`)."""
    return f"_tokens/{check_topic(topic)}/"


def token_key(topic: str, seq: int) -> str:
    """Token `seq` of a topic's chain."""
    if not 0 <= seq < 10**12:
        raise ValueError(f"sequence number {seq} out of range")
    return f"{chain_folder(topic)}{seq:012d}.json"


def link_seq(key: str) -> int | None:
    """The sequence number of a token's key, or None if `key` is not one."""
    match = _LINK_RE.fullmatch(key.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def head_key(topic: str) -> str:
    """Where the newest commit records its seq: where a search for the newest token starts."""
    return f"_heads/{check_topic(topic)}.json"


def legacy_rebuilds_folder(topic: str) -> str:
    """Where rebuilds committed before they joined the token chain (read for history only)."""
    return f"_rebuilds/{check_topic(topic)}/"


def claims_folder(topic: str, kind: str) -> str:
    return f"_claims/{check_topic(topic)}/{kind}/"


def claim_key(topic: str, kind: str, seq: int, k: int) -> str:
    """Claim `k` on token `seq`; the claims of one seq sort by `k`, the newest is live."""
    if not 0 < k < 10**6:
        raise ValueError(f"claim number {k} out of range")
    return f"{claims_folder(topic, kind)}{seq:012d}-{k:06d}.json"


def claim_numbers(key: str) -> tuple[int, int] | None:
    """(seq, k) of a claim key, or None if `key` is not one."""
    match = _CLAIM_RE.fullmatch(key.rsplit("/", 1)[-1])
    return (int(match.group(1)), int(match.group(2))) if match else None


def attempts_folder(topic: str) -> str:
    """Where attempts stage their files until their link commits (never read as data)."""
    return f"_attempts/{check_topic(topic)}/"


def attempt_prefix(topic: str, attempt_id: str) -> str:
    check_id(attempt_id)
    return f"{attempts_folder(topic)}{attempt_id}/"


def check_id(attempt_id: str) -> str:
    if not _SAFE_ID_RE.fullmatch(attempt_id) or attempt_id in (".", ".."):
        raise ValueError(f"unsafe attempt id {attempt_id!r}")
    return attempt_id


def manifests_folder(topic: str) -> str:
    """Where the manifests of a topic's published attempts are (`manifest_key`)."""
    return f"_manifests/{check_topic(topic)}/"


def manifest_key(topic: str, attempt_id: str) -> str:
    return f"{manifests_folder(topic)}{check_id(attempt_id)}.json"


def publishing_folder(topic: str) -> str:
    """Where the pending marks of a topic's commits are (`pending_key`)."""
    return f"_publishing/{check_topic(topic)}/"


def pending_key(topic: str, attempt_id: str) -> str:
    """Present from an attempt's first try to create its token until its files are all in
    their data folders."""
    return f"{publishing_folder(topic)}{check_id(attempt_id)}.json"


@dataclass(frozen=True)
class DataFile:
    """A data file's identity, recovered from its key: a run's file (its partition and first
    offset), or a sealed file (`chunk`: the records of its folder merged when sealed, from any
    partition; `partition` and `first_offset` are then None)."""

    kind: DataKind
    topic: str
    folder: str
    gen: int
    partition: int | None
    first_offset: int | None
    chunk: int | None = None

    @property
    def sealed(self) -> bool:
        return self.chunk is not None

    @property
    def offset(self) -> int:
        """A run's file's first offset (a backup file is always one; a sealed file has none)."""
        if self.first_offset is None:
            raise ValueError(f"{self.key} is a sealed file: it starts at no one offset")
        return self.first_offset

    @property
    def key(self) -> str:
        if self.chunk is not None:
            name = sealed_file_name(self.gen, self.chunk)
        else:
            assert self.partition is not None and self.first_offset is not None  # a run's file
            name = data_file_name(self.gen, self.partition, self.first_offset)
        return f"{self.kind}/{self.topic}/{self.folder}/{name}"


def parse_data_key(key: str) -> DataFile | None:
    """Invert the data-key builders; None for anything that is not a canonical data file key."""
    parts = key.split("/")
    if len(parts) < 4 or parts[0] not in DATA_KINDS or not _is_topic(parts[1]):
        return None
    kind, topic, folder, name = parts[0], parts[1], "/".join(parts[2:-1]), parts[-1]
    if not is_safe_folder(folder):
        return None
    if kind == "quarantine" and not _is_date_folder(folder):
        return None
    sealed = _SEALED_RE.fullmatch(name)
    match = _FILE_RE.fullmatch(name)
    try:
        if sealed and kind != "backup":
            gen, chunk = (int(g) for g in sealed.groups())
            found = DataFile(kind, topic, folder, gen, None, None, chunk)
        elif match:
            gen, partition, first = (int(g) for g in match.groups())
            if kind == "backup" and folder != f"partition={partition}":
                return None
            found = DataFile(kind, topic, folder, gen, partition, first)
        else:
            return None
        return found if found.key == key else None  # rejects non-canonical numbers
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)  # the writers ask it for every record's folder
def is_safe_folder(folder: str) -> bool:
    """True if every segment is a Hive-style `key=value` that cannot escape or confuse a path."""
    segments = folder.split("/")
    return all(
        seg and "=" in seg and ".." not in seg and "\\" not in seg and "\0" not in seg
        for seg in segments
    )


def check_path_format(path_format: str) -> str:
    """Validate a per-topic folder format; return it unchanged.

    Only `%Y %m %d %H %M` and the literals `[A-Za-z0-9_-]` are allowed, in Hive-style
    `key=value` segments so Spark, Trino and Athena discover them. `%Y %m %d` are required so
    each folder belongs to exactly one date (what the rebuild DAG re-derives).
    """
    keys = []
    for segment in path_format.split("/"):
        key, sep, value = segment.partition("=")
        if not sep or not _HIVE_KEY_RE.fullmatch(key) or not _FORMAT_VALUE_RE.fullmatch(value):
            raise ValueError(
                f"segment {segment!r} must be key=value with a lowercase key and a value of "
                "%Y %m %d %H %M and [A-Za-z0-9_-] only"
            )
        keys.append(key)
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated folder key in {path_format!r}")
    missing = [d for d in ("%Y", "%m", "%d") if d not in path_format]
    if missing:
        raise ValueError(f"{path_format!r} lacks {' '.join(missing)}: each folder needs a date")
    return path_format


def event_folder(path_format: str, when: datetime, tz: tzinfo) -> str:
    """The folder for an aware datetime, rendered in the topic's timezone."""
    if when.tzinfo is None:
        raise ValueError("event_folder needs a timezone-aware datetime")
    return when.astimezone(tz).strftime(path_format)


def folder_date(folder: str, path_format: str = DEFAULT_PATH_FORMAT) -> date:
    """The date a partitioned folder belongs to (in the topic's timezone)."""
    return datetime.strptime(folder, path_format).date()


def date_prefix(path_format: str, day: date) -> str:
    """The leading folders that `day` alone fixes (`dt=2024-06-01/` by default; may be "")."""
    fixed = takewhile(lambda s: "%H" not in s and "%M" not in s, path_format.split("/"))
    midnight = datetime.combine(day, time())
    return "".join(f"{midnight.strftime(segment)}/" for segment in fixed)


def date_folder(path_format: str, day: date) -> str | None:
    """The one folder holding all of `day`'s partitioned folders (`dt=2024-06-01`), or None if
    the format's leading folders do not fix the whole date (`hr=%H/dt=%Y-%m-%d`)."""
    fixed = "/".join(takewhile(lambda s: "%H" not in s and "%M" not in s, path_format.split("/")))
    if not all(d in fixed for d in ("%Y", "%m", "%d")):
        return None
    return date_prefix(path_format, day).rstrip("/")


SEALED_MARKER = "_SEALED"
"""A sealed date's proof of completeness, in its date folder (readers skip `_` files)."""


def proof_key(topic: str, folder: str) -> str:
    """The proof (`_SEALED`) of a sealed date whose date folder is `folder`."""
    if not is_safe_folder(folder):
        raise ValueError(f"unsafe partition folder {folder!r}")
    return f"partitioned/{check_topic(topic)}/{folder}/{SEALED_MARKER}"


def table_folder(day: date) -> str:
    """The folder of `day`'s table data files, relative to the table's location (Hive-style, as
    Iceberg lays out an identity partition)."""
    return f"data/_event_date={day.isoformat()}"


def table_file_name(day: date, attempt_id: str, folder: int, chunk: int) -> str:
    """A table data file of `day`: chunk `chunk` of folder `folder` of seal attempt
    `attempt_id`, relative to the table's location; named after the attempt, so what a seal
    that never commits wrote is found by its name (`cairn.protocol.leftovers`)."""
    return f"{table_folder(day)}/{check_id(attempt_id)}-{folder:05d}-{chunk:03d}.parquet"


def status_folder(topic: str) -> str:
    return f"_status/{check_topic(topic)}/"


def status_key(topic: str, seq: int) -> str:
    """The run record of token `seq` (`cairn.pipeline.run_record`)."""
    return f"{status_folder(topic)}{seq:012d}.json"


def success_key(topic: str, folder: str) -> str:
    """The `_SUCCESS` marker of a complete date whose date folder is `folder`."""
    if not is_safe_folder(folder):
        raise ValueError(f"unsafe partition folder {folder!r}")
    return f"partitioned/{check_topic(topic)}/{folder}/{SUCCESS_MARKER}"


def completeness_key(topic: str) -> str:
    """Where a topic's completeness state lives (`cairn.pipeline.completeness`)."""
    return f"_complete/{check_topic(topic)}.json"


def _is_topic(name: object) -> bool:
    return isinstance(name, str) and bool(_TOPIC_RE.fullmatch(name)) and name not in (".", "..")


def _is_date_folder(folder: str) -> bool:
    try:
        return folder_date(folder, "dt=%Y-%m-%d").isoformat() == folder[3:]
    except ValueError:
        return False
