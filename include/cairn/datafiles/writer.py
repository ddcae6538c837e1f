"""The one-pass writer: one Kafka partition's records in, backup/partitioned/quarantine files out.

The Spark job calls `write_partition` once per Kafka partition's range; Spark hands a task the
records of one range, or of several tiny ones (`cairn.packing`), in offset order. Every file
streams through `Storage.open_write` into the attempt's staging area (`cairn.protocol.commit`),
whole or not at all, and is named by the offset of its first record, so the same input always
yields the same names (a retry overwrites, never duplicates).

Memory is bounded by open writers, not by records: each Avro writer buffers one block
(`cairn.datafiles.avro_file.SYNC_INTERVAL`), and at most `max_open_files` partitioned writers plus
the backup and quarantine writers are open. Without the cap, late data spread over many hours (or a
replay of a year) would open one writer per folder at once and memory would grow with the spread,
the out-of-memory that Kafka Connect's S3 sink users hit. With it, the least recently used folder is
finished early and a later record for that folder starts a new file named by its own offset:
a few more files, the same bounded memory, and still deterministic names.

`ParsedWriter` (partitioned and quarantine files) is shared with `cairn.pipeline.rebuild`, which
re-derives a date from the backup: both write the same names, file entries and memory bound.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, NonNegativeInt

from cairn.datafiles.avro_file import (
    BACKUP_SCHEMA,
    QUARANTINE_SCHEMA,
    AvroFileWriter,
    decode_backup,
    encode_quarantine,
)
from cairn.datafiles.fastpath import OUTPUT_COLUMNS
from cairn.datafiles.file_entry import FileEntry
from cairn.formats import Registries, open_format
from cairn.formats.base import KafkaCoords, Parsed, Quarantined
from cairn.storage.layout import (
    DataKind,
    backup_key,
    event_folder,
    is_safe_folder,
    partitioned_key,
    quarantine_key,
)
from cairn.storage.objects import Storage

if TYPE_CHECKING:
    from cairn.config import TopicConfig

DEFAULT_MAX_OPEN_FILES = 256
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_MINUTES_KEPT = 10_000  # folders remembered per writer (a week of minutes; ~1 MB)
# Group ids of a batch's records that are not (yet) in a folder (`ParsedWriter.write_encoded`).
_QUARANTINE, _RENDER, _UNSAFE = -1, -2, -3


class KafkaRecord(NamedTuple):
    """One Kafka record as the Spark Kafka source delivers it (timestamp in epoch millis)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None = None


class EncodedRecord(NamedTuple):
    """One Kafka record as the Spark job hands it over (`cairn.datafiles.fastpath`): its
    coordinates, its backup datum, and, when the JVM parsed the value, the partitioned datum and
    its event time (epoch millis). `datum` None: the Python parser decides, from the value in the
    backup."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    backup: bytes
    datum: bytes | None = None
    event_time: int | None = None


class PartitionResult(BaseModel):
    """What one call wrote, plus the per-partition totals the manifest and time lag need.

    A pydantic model so the Spark job can ship it from executor to driver as JSON.
    """

    partition: NonNegativeInt | None  # None when the call got no records
    records: NonNegativeInt  # records read from the iterator (== records in backup)
    first_timestamp: int | None = None  # Kafka timestamp of the first record, epoch millis
    last_timestamp: int | None  # Kafka timestamp of the last record, epoch millis; None if none
    files: list[FileEntry]


def check_write_args(cfg: TopicConfig, processing_time: datetime, max_open_files: int) -> str:
    """The topic to write; refuses what would misname files or leave memory unbounded."""
    if cfg.topic is None:
        raise ValueError(f"{cfg.label}: resolve the pattern to a topic before writing")
    if processing_time.tzinfo is None:
        raise ValueError("processing_time must be timezone-aware")
    if max_open_files < 1:
        raise ValueError(f"max_open_files must be at least 1, not {max_open_files}")
    return cfg.topic


def write_partition(
    records: Iterable[KafkaRecord | EncodedRecord | pa.RecordBatch],
    cfg: TopicConfig,
    storage: Storage,
    processing_time: datetime,
    attempt_id: str,
    max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    registries: Registries | None = None,
) -> PartitionResult:
    """Write one Kafka partition's records (offset order) in one pass; see the module doc.

    Records come decoded (`KafkaRecord`: everything is encoded and parsed here) or as the
    Spark job's JVM encoded them (`EncodedRecord`, or Arrow batches of its columns,
    `cairn.datafiles.fastpath.OUTPUT_COLUMNS`); all give the same bytes.
    `storage` is the attempt's staging area; `registries` holds the Schema Registry client
    configurations the topic's format needs (`cairn.formats.open_format`). On any exception
    the files still open are discarded and the exception propagates; files already written stay
    in staging, where a retry of the same attempt rewrites them byte for byte (same records,
    same processing time).
    """
    topic = check_write_args(cfg, processing_time, max_open_files)
    with contextlib.ExitStack() as uploads:  # on error, discards every upload still open
        files = OutputFiles(storage, cfg.codec, uploads)
        writer = _PartitionWriter(
            cfg, topic, files, processing_time, max_open_files, attempt_id, registries
        )
        for record in records:
            if isinstance(record, pa.RecordBatch):
                writer.write_batch(record)
            else:
                writer.write(record)
        return writer.finish()


def encoded_records(batch: pa.RecordBatch) -> Iterator[EncodedRecord]:
    """The records of an Arrow batch of `cairn.datafiles.fastpath.OUTPUT_COLUMNS`, one by one."""
    columns = [batch.column(name).to_pylist() for name in OUTPUT_COLUMNS]
    for row in zip(*columns, strict=True):
        yield EncodedRecord(*row)


class _OpenFile:
    """One Avro object streaming through `Storage.open_write`.

    Its upload is registered with the call's ExitStack, which discards it if an error unwinds
    the call; `finish` completes it early (the stack's later exit of it is then a no-op; the
    stack keeps one empty ExitStack per file, which is as small as the FileEntry list).
    """

    def __init__(
        self,
        files: OutputFiles,
        key: str,
        kind: DataKind,
        partition: int,
        schema: dict[str, Any],
        metadata: dict[str, str],
    ) -> None:
        self.storage, self.key, self.kind, self.partition = files.storage, key, kind, partition
        with contextlib.ExitStack() as stack:  # a bad codec must not leave the upload open
            out = stack.enter_context(files.storage.open_write(key))
            self.avro = AvroFileWriter(out, schema, files.codec, metadata=metadata, name=key)
            self._upload = stack.pop_all()
        files.uploads.push(self._upload)

    def finish(self) -> FileEntry:
        with self._upload:  # an error while writing the last block discards the object
            self.avro.close()
        s = self.avro.stats
        assert s.min_offset is not None and s.max_offset is not None  # opened for a record
        return FileEntry(
            key=self.key,
            kind=self.kind,
            partition=self.partition,
            records=s.records,
            first_offset=s.min_offset,
            last_offset=s.max_offset,
            min_event_time=s.min_event_time,
            max_event_time=s.max_event_time,
            bytes=self.storage.size(self.key),
        )


class OutputFiles:
    """The files one call streams to storage, and the entries of those it finished, in order.

    Every upload is registered with `uploads`, so an error that unwinds the caller's ExitStack
    discards all files not yet finished. `storage` is the attempt's staging area
    (`cairn.protocol.commit.staged`): keys are final keys, published only when the attempt commits.
    """

    def __init__(self, storage: Storage, codec: str, uploads: contextlib.ExitStack) -> None:
        self.storage, self.codec, self.uploads = storage, codec, uploads
        self.files: list[FileEntry] = []

    def open(
        self,
        key: str,
        kind: DataKind,
        partition: int,
        schema: dict[str, Any],
        metadata: dict[str, str],
    ) -> _OpenFile:
        return _OpenFile(self, key, kind, partition, schema, metadata)

    def finish(self, f: _OpenFile) -> None:
        self.files.append(f.finish())


class ParsedWriter:
    """The partitioned and quarantine files of one Kafka partition: the part of writing that the
    archive and the rebuild from backup share.

    Records come in as verbatim (`BACKUP_SCHEMA`) dicts in offset order. The caller `parse`s
    each and `write`s the ones it keeps: the archive keeps all, a rebuild the ones it
    re-derives. Quarantine goes to the folder of `quarantine_date` (the processing date), and
    records there carry `processing_time`. Every file's header names `source`, the backup file
    holding its records, and the processing time, which is what a rebuild needs to re-derive it.
    """

    def __init__(
        self,
        cfg: TopicConfig,
        files: OutputFiles,
        processing_time: datetime,
        quarantine_date: date,
        max_open_files: int,
        registries: Registries | None = None,
    ) -> None:
        self.cfg, self.files, self.max_open = cfg, files, max_open_files
        self.topic = check_write_args(cfg, processing_time, max_open_files)
        self.processing_time, self.quarantine_date = processing_time, quarantine_date
        self.processing_ms = (processing_time - _EPOCH) // _MS
        self.format = open_format(cfg, registries)
        self.schema = self.format.schema
        self.quarantine: _OpenFile | None = None
        self.partitioned: OrderedDict[str, _OpenFile] = OrderedDict()  # least recent first
        self.source = ""
        """The backup key of the records being written (set before the first `write`)."""
        self._format = cfg.path_format
        self._processing_folder = event_folder(self._format, processing_time, cfg.tzinfo)
        self._minute_folders: dict[int, str | None] = {}

    def parse(self, verbatim: dict[str, Any]) -> Parsed | Quarantined:
        coords = KafkaCoords(verbatim["partition"], verbatim["offset"], verbatim["timestamp"])
        return self.format.parse(verbatim["value"], coords, self.processing_time)

    def write(self, verbatim: dict[str, Any], result: Parsed | Quarantined) -> None:
        partition, offset = verbatim["partition"], verbatim["offset"]
        if isinstance(result, Parsed):
            out = self._partitioned(result.folder, partition, offset)
            out.avro.append_datum(result.datum, offset, result.event_time)
            return
        self._quarantine(partition, offset).avro.append(self._quarantined(verbatim, result), offset)

    def _quarantine(self, partition: int, offset: int) -> _OpenFile:
        """The quarantine file, opened for the record at `offset` if it is the first."""
        if self.quarantine is None:
            gen = self.cfg.generation
            key = quarantine_key(self.topic, gen, partition, offset, self.quarantine_date)
            self.quarantine = self.files.open(
                key, "quarantine", partition, QUARANTINE_SCHEMA, self._metadata()
            )
        return self.quarantine

    def _quarantined(self, verbatim: dict[str, Any], result: Quarantined) -> dict[str, Any]:
        return verbatim | {"reason": result.reason, "processing_time": self.processing_ms}

    def write_encoded(self, batch: pa.RecordBatch, offsets: np.ndarray) -> bool:
        """File a batch the JVM encoded (`cairn.datafiles.fastpath.OUTPUT_COLUMNS`; one partition,
        offset order) as `write_datum` would each record, and `parse` and `write` each record the
        JVM did not take: the same files, blocks and recency order, at a cost per folder rather than
        per record. False, with nothing written, when the batch would open more files than
        `max_open_files`: the caller then writes it record by record, evicting as ever."""
        partition = batch.column("partition")[0].as_py()
        datums, times = batch.column("datum"), batch.column("event_time")
        timed = times.is_null() if self.cfg.event_time is None else times.is_valid()
        filed = pc.and_(datums.is_valid(), timed).to_numpy(zero_copy_only=False)
        folders: dict[str, int] = {}
        groups = self._group_filed(filed, pc.fill_null(times, 0).to_numpy(), folders)
        filed &= groups != _UNSAFE
        extra: dict[int, tuple[bytes, int | None]] = {}  # what the Python parser gave
        backups = batch.column("backup")
        for row in np.flatnonzero(~filed).tolist():
            verbatim = decode_backup(backups[row].as_py())
            result = self.parse(verbatim)
            if isinstance(result, Parsed):
                groups[row] = folders.setdefault(result.folder, len(folders))
                extra[row] = result.datum, result.event_time
            else:
                groups[row] = _QUARANTINE
                extra[row] = encode_quarantine(self._quarantined(verbatim, result)), None
        if len(self.partitioned) + len(folders.keys() - self.partitioned.keys()) > self.max_open:
            return False
        if extra:
            datums, times = _replaced(datums, times, extra)
        names = {group: folder for folder, group in folders.items()}
        order = np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        runs = sorted(np.split(order, cuts), key=lambda rows: rows[0])  # first record first
        for rows in runs:
            group, first, take = int(groups[rows[0]]), int(offsets[rows[0]]), pa.array(rows)
            if group == _QUARANTINE:
                self._quarantine(partition, first).avro.append_datums(
                    datums.take(take), offsets[rows]
                )
            else:
                out = self._partitioned(names[group], partition, first)
                out.avro.append_datums(datums.take(take), offsets[rows], times.take(take))
        for rows in sorted(runs, key=lambda rows: rows[-1]):  # recency as record by record
            if groups[rows[0]] != _QUARANTINE:
                self.partitioned.move_to_end(names[int(groups[rows[0]])])
        return True

    def _group_filed(
        self, filed: np.ndarray, millis: np.ndarray, folders: dict[str, int]
    ) -> np.ndarray:
        """Each filed record's folder as a group id (`folders` maps folder to id, and gets the
        new ones); `_UNSAFE` for a folder `parse` would refuse, `_QUARANTINE` for the rest."""
        groups = np.full(len(filed), _QUARANTINE, dtype=np.int64)
        rows = np.flatnonzero(filed)

        def group_of(folder: str) -> int:
            return folders.setdefault(folder, len(folders)) if is_safe_folder(folder) else _UNSAFE

        if self.cfg.event_time is None:
            groups[rows] = group_of(self._processing_folder)
            return groups
        minutes, at = np.unique(millis[rows] // 60_000, return_inverse=True)
        ids = [_RENDER if f is None else group_of(f) for f in map(self._minute, minutes.tolist())]
        groups[rows] = np.array(ids, dtype=np.int64)[at]
        for row in rows[groups[rows] == _RENDER].tolist():
            groups[row] = group_of(self._folder_of(int(millis[row])))
        return groups

    def write_datum(
        self, datum: bytes, partition: int, offset: int, event_time: int | None
    ) -> bool:
        """File a record the JVM parsed and encoded (`cairn.datafiles.fastpath`) by its event
        time, as `parse` would; False (nothing written) if its folder is not one `parse` would
        accept."""
        if (event_time is None) != (self.cfg.event_time is None):
            return False
        folder = self._folder_of(event_time)
        if not is_safe_folder(folder):
            return False
        out = self._partitioned(folder, partition, offset)
        out.avro.append_datum(datum, offset, event_time)
        return True

    def _folder_of(self, event_time: int | None) -> str:
        """The folder of an event time (or of the processing time), through a memo of UTC
        minutes: rendering a folder costs more than the rest of filing a record."""
        if event_time is None:
            return self._processing_folder
        folder = self._minute(event_time // 60_000)
        return folder if folder is not None else self._render(event_time)

    def _minute(self, minute: int) -> str | None:
        """`_minute_folder`, remembered."""
        if minute not in self._minute_folders:
            if len(self._minute_folders) >= _MINUTES_KEPT:
                self._minute_folders.clear()
            self._minute_folders[minute] = self._minute_folder(minute)
        return self._minute_folders[minute]

    def _minute_folder(self, minute: int) -> str | None:
        """The one folder of every millisecond of a UTC minute, or None if it has two.

        With one offset throughout, local time only moves forward, so the minute's first and
        last millisecond in the same folder mean all of it is (folders name minutes at most).
        """
        first, last = minute * 60_000, minute * 60_000 + 59_999
        tz = self.cfg.tzinfo
        offsets = (_EPOCH + first * _MS).astimezone(tz), (_EPOCH + last * _MS).astimezone(tz)
        folder = self._render(first)
        same = offsets[0].utcoffset() == offsets[1].utcoffset() and folder == self._render(last)
        return folder if same else None

    def _render(self, millis: int) -> str:
        """The folder of an event time: `layout.event_folder`, the one place folders are made."""
        return event_folder(self._format, _EPOCH + millis * _MS, self.cfg.tzinfo)

    def close(self) -> None:
        """Finish the files still open (quarantine first, then partitioned)."""
        for f in (self.quarantine, *self.partitioned.values()):
            if f is not None:
                self.files.finish(f)
        self.quarantine = None
        self.partitioned.clear()

    def _partitioned(self, folder: str, partition: int, offset: int) -> _OpenFile:
        """The open file for `folder`, least-recently-used eviction keeping at most max_open."""
        found = self.partitioned.get(folder)
        if found is not None:
            self.partitioned.move_to_end(folder)
            return found
        if len(self.partitioned) >= self.max_open:
            _, evicted = self.partitioned.popitem(last=False)
            self.files.finish(evicted)
        key = partitioned_key(self.topic, self.cfg.generation, partition, offset, folder)
        opened = self.files.open(key, "partitioned", partition, self.schema, self._metadata())
        self.partitioned[folder] = opened
        return opened

    def _metadata(self) -> dict[str, str]:
        return file_metadata(self.processing_time, source=self.source)


class _PartitionWriter:
    """The archive's writer: every record to backup, and (formats that parse) to `ParsedWriter`."""

    def __init__(
        self,
        cfg: TopicConfig,
        topic: str,
        files: OutputFiles,
        processing_time: datetime,
        max_open_files: int,
        attempt_id: str,
        registries: Registries | None,
    ) -> None:
        self.cfg, self.topic, self.files = cfg, topic, files
        self.processing_time, self.attempt_id = processing_time, attempt_id
        self.parsed: ParsedWriter | None = None
        if cfg.parses:  # raw topics: backup only
            # The quarantine folder is the processing date in the topic's timezone.
            day = processing_time.astimezone(cfg.tzinfo).date()
            self.parsed = ParsedWriter(cfg, files, processing_time, day, max_open_files, registries)
        self.backup: _OpenFile | None = None
        self.records = 0
        self.first_timestamp: int | None = None
        self.last: KafkaRecord | EncodedRecord | None = None

    def write(self, r: KafkaRecord | EncodedRecord) -> None:
        self._check(r)
        self.records, self.last = self.records + 1, r
        if self.first_timestamp is None:
            self.first_timestamp = r.timestamp
        self._open_backup(r)
        assert self.backup is not None
        if isinstance(r, EncodedRecord):
            self.backup.avro.append_datum(r.backup, r.offset)
            parsed = self.parsed
            if parsed is None or (
                r.datum is not None
                and parsed.write_datum(r.datum, r.partition, r.offset, r.event_time)
            ):
                return
            verbatim = decode_backup(r.backup)
        else:
            verbatim = _verbatim(r)
            self.backup.avro.append(verbatim, r.offset)
        if self.parsed is not None:
            self.parsed.write(verbatim, self.parsed.parse(verbatim))

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """`write` each record of an Arrow batch of `cairn.datafiles.fastpath.OUTPUT_COLUMNS`, at a
        cost per block and folder rather than per record. A batch that is not one partition in
        offset order after the records before it, or that would open more files than allowed, goes
        record by record, where `write` refuses or evicts as it always has."""
        if batch.num_rows == 0:
            return
        offsets = batch.column("offset").to_numpy()
        first = _row(batch, 0)
        if not self._in_order(batch, first, offsets):
            self._write_each(batch)
            return
        self._open_backup(first)
        assert self.backup is not None
        if self.parsed is not None and not self.parsed.write_encoded(batch, offsets):
            self._write_each(batch)  # nothing of the batch was written yet
            return
        self.backup.avro.append_datums(batch.column("backup"), offsets)
        self.records, self.last = self.records + batch.num_rows, _row(batch, batch.num_rows - 1)
        if self.first_timestamp is None:
            self.first_timestamp = first.timestamp

    def _write_each(self, batch: pa.RecordBatch) -> None:
        for record in encoded_records(batch):
            self.write(record)

    def _in_order(self, batch: pa.RecordBatch, first: EncodedRecord, offsets: np.ndarray) -> bool:
        """Whether `_check` would pass every record of the batch."""
        topics, partitions = batch.column("topic"), batch.column("partition")
        last = self.last
        return (
            topics.null_count == partitions.null_count == 0
            and pc.all(pc.equal(topics, self.topic)).as_py()
            and pc.all(pc.equal(partitions, first.partition)).as_py()
            and (last is None or (first.partition == last.partition and first.offset > last.offset))
            and bool(np.all(np.diff(offsets) > 0))
        )

    def _open_backup(self, first: KafkaRecord | EncodedRecord) -> None:
        if self.backup is None:
            key = backup_key(self.topic, self.cfg.generation, first.partition, first.offset)
            meta = file_metadata(self.processing_time, attempt=self.attempt_id)
            self.backup = self.files.open(key, "backup", first.partition, BACKUP_SCHEMA, meta)
            if self.parsed is not None:
                self.parsed.source = key

    def finish(self) -> PartitionResult:
        if self.backup is not None:
            self.files.finish(self.backup)
        if self.parsed is not None:
            self.parsed.close()
        last = self.last
        return PartitionResult(
            partition=None if last is None else last.partition,
            records=self.records,
            first_timestamp=self.first_timestamp,
            last_timestamp=None if last is None else last.timestamp,
            files=self.files.files,
        )

    def _check(self, r: KafkaRecord | EncodedRecord) -> None:
        """File names and verify's offset spans rely on one topic-partition in offset order."""
        if r.topic != self.topic:
            raise ValueError(f"record of topic {r.topic!r} given to the writer of {self.topic!r}")
        last = self.last
        if last is not None and r.partition != last.partition:
            raise ValueError(f"partition {r.partition} after {last.partition}: one per call")
        if last is not None and r.offset <= last.offset:
            raise ValueError(f"partition {r.partition}: offset {r.offset} after {last.offset}")


def _row(batch: pa.RecordBatch, index: int) -> EncodedRecord:
    return next(encoded_records(batch.slice(index, 1)))


def _replaced(
    datums: pa.Array, times: pa.Array, rows: dict[int, tuple[bytes, int | None]]
) -> tuple[pa.Array, pa.Array]:
    """The batch's datums and event times with those of `rows` replaced."""
    datum_list, time_list = datums.to_pylist(), times.to_pylist()
    for row, (datum, time) in rows.items():
        datum_list[row], time_list[row] = datum, time
    return pa.array(datum_list, pa.binary()), pa.array(time_list, pa.int64())


def file_metadata(processing_time: datetime, **names: str) -> dict[str, str]:
    """Avro header metadata of a data file: `cairn.processing_time` plus `cairn.<name>`."""
    meta = {"cairn.processing_time": processing_time.isoformat()}
    return meta | {f"cairn.{name}": value for name, value in names.items()}


def _verbatim(r: KafkaRecord) -> dict[str, Any]:
    """The backup record; bytes() is a no-op for bytes and copies bytearrays from Spark rows."""
    return {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "timestamp_type": r.timestamp_type,
        "key": None if r.key is None else bytes(r.key),
        "value": None if r.value is None else bytes(r.value),
        "headers": [
            {"key": k, "value": None if v is None else bytes(v)} for k, v in r.headers or ()
        ],
    }
