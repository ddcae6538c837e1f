"""Sealing: a complete date of a topic becomes a few large files, its partition of the topic's
Iceberg table, and a proof of completeness.

A seal is an attempt (`cairn.protocol.attempt`, `SEAL`), step by step (the seal DAG runs them;
`seal_folder` runs on Spark executors, one task per folder): `select` lists the date's files with
their versions and claims the attempt; `seal_folder` merges a folder's files block by block into
`<gen>_sealed_<n>.avro` files in the attempt's staging, each naming in its header the backup files
and offsets its records came from, and decodes each record once for the table's Parquet files and
the proof's counts; `finish_seal` commits (`commit_seal`), replaces the date in the table
(`cairn.table.iceberg`), writes the proof `_SEALED` and keeps the table (`cairn.table.upkeep`).

docs/table.md says what sealing does and why (backup files are not merged, late data, the table,
the proof); docs/protocol.md describes the commit protocol a seal goes through.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import IO, TYPE_CHECKING, Literal

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt

from cairn.datafiles.avro_file import (
    QUARANTINE_SCHEMA,
    Header,
    raw_blocks,
    read_header,
    with_schema,
)
from cairn.datafiles.parquet_file import (
    EVENT_DATE,
    ParquetFileWriter,
    avro_to_arrow,
    json_fields,
)
from cairn.datafiles.sealed_file import (
    ReEncoded,
    SealedFileWriter,
    SourceSpan,
    canonical,
    sources_of,
)
from cairn.errors import PermanentError
from cairn.formats.base import output_schema
from cairn.pipeline import completeness
from cairn.pipeline.proof import (
    Proof,
    SourceTally,
    mark_expired,
    merged,
    offset_ranges,
    read_proof,
    table_summary,
    write_proof,
)
from cairn.pipeline.rebuild import day_versions
from cairn.protocol import commit, leftovers, tokens
from cairn.protocol.attempt import Attempts, Claimed
from cairn.protocol.format_version import Versioned
from cairn.protocol.tokens import Sealed, SealPayload, Token
from cairn.storage.layout import (
    DataFile,
    DataKind,
    kind_folder,
    parse_data_key,
    sealed_file_name,
    table_file_name,
    table_folder,
)
from cairn.storage.objects import Storage
from cairn.table.catalog import TableTarget

if TYPE_CHECKING:
    from cairn.config import TopicConfig
    from cairn.table.iceberg import IcebergCatalog

log = logging.getLogger(__name__)


class SealRefused(PermanentError):
    """The sealed files would not hold exactly the records of the files they replace."""


class SealInput(BaseModel):
    key: str
    version: str
    bytes: NonNegativeInt


class SealFolder(BaseModel):
    """One folder of the date and the files sealing merges there."""

    kind: Literal["partitioned", "quarantine"]
    folder: str
    inputs: list[SealInput]


class Selection(Claimed):
    """What one seal merges; stored in its claim."""

    date: date
    folders: list[SealFolder]
    target_bytes: PositiveInt
    generation: PositiveInt
    output_schema_json: str
    """The partitioned files' schema now: what a folder's sealed files are written with."""
    table: TableTarget | None = None

    def schema_of(self, kind: str) -> dict:
        """The schema a folder of `kind` is sealed with."""
        return json.loads(self.output_schema_json) if kind == "partitioned" else QUARANTINE_SCHEMA

    def table_schema(self) -> pa.Schema:
        """The schema of the date's table files: the parsed records and `_event_date`."""
        parsed = avro_to_arrow(self.schema_of("partitioned"))
        return parsed.append(pa.field(EVENT_DATE, pa.date32(), False))

    def reach(self, table: leftovers.Remover | None) -> leftovers.Elsewhere:
        """Where this seal writes outside the archive root (`table`: what removes its files in
        the table's location), for `cairn.protocol.leftovers`."""
        return {self.table.location: table} if self.table and table else {}

    @property
    def inputs(self) -> dict[str, SealInput]:
        return {i.key: i for f in self.folders for i in f.inputs}

    def versions(self) -> dict[str, str]:
        """Each file it replaces, and its version when selected."""
        return {key: i.version for key, i in self.inputs.items()}


class SealedFile(BaseModel):
    key: str
    records: NonNegativeInt
    bytes: NonNegativeInt


class TableFile(BaseModel):
    path: str
    """Relative to the table's location."""
    records: NonNegativeInt


class FolderResult(BaseModel):
    """What `seal_folder` wrote for one folder and what it read."""

    kind: Literal["partitioned", "quarantine"]
    folder: str
    files: list[SealedFile]
    table_files: list[TableFile] = Field(default_factory=list)
    records_read: NonNegativeInt = 0
    spans: list[SourceSpan] = Field(default_factory=list)
    checksum: NonNegativeInt = 0


class SealAttempt(Versioned):
    """What a seal's Spark job staged and counted: its attempt manifest."""

    topic: str
    attempt_id: str
    folders: list[FolderResult]
    created_at: datetime

    @property
    def sealed(self) -> list[SealedFile]:
        return [f for folder in self.folders for f in folder.files]

    def proof(self, chosen: Selection) -> Proof:
        spans: dict[tuple[str | None, int], SourceSpan] = {}
        for folder in self.folders:
            for span in folder.spans:
                spans[span.source, span.partition] = merged(
                    spans.get((span.source, span.partition)), span
                )
        partitions: dict[int, list[SourceSpan]] = defaultdict(list)
        for span in sorted(spans.values(), key=lambda s: (s.partition, s.first)):
            partitions[span.partition].append(span)

        def records(kind: str) -> int:
            return sum(f.records_read for f in self.folders if f.kind == kind)

        return Proof(
            topic=self.topic,
            date=chosen.date,
            partitions=dict(partitions),
            partitioned=records("partitioned"),
            quarantined=records("quarantine"),
            checksum=str(sum(f.checksum for f in self.folders)),
            files_before=sum(len(f.inputs) for f in chosen.folders),
            files_after=sum(len(f.files) for f in self.folders),
        )


SEAL = Attempts("seal", Selection, SealAttempt, SealRefused, what="seal manifest")
load_claimed = SEAL.load
"""The selection stored in a claim object (how the Spark job receives it)."""
load_attempt = SEAL.load_attempt


def select(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    run_id: str,
    table: TableTarget | None = None,
) -> Selection | None:
    """Claim a seal of `day`; None if it is not complete, has no files, holds files a rewind
    set back (they are read again first: the seal waits), or was sealed to the end (files,
    table, proof) and its unsealed part is below the re-seal threshold. A seal that did not
    finish (its commit task gave up between the token and the proof) or that had no table to
    write while `table` is now given is done again, whole. What attempts that can no longer
    commit left is removed first (`cairn.protocol.leftovers`)."""
    topic = cfg.topic_name
    through = completeness.load_state(storage, topic).through
    if through is None or day > through:
        return None
    newest = commit.settle(storage, topic)
    leftovers.sweep(storage, topic)
    files = day_versions(storage, topic, cfg.path_format, day)
    rewound = rewound_files(files, newest)
    if rewound:
        log.info(
            "topic %s %s: %d files were set back by a rewind (%s ...): the seal waits until "
            "the archive has read them again",
            topic,
            day,
            len(rewound),
            rewound[0],
        )
        return None
    unsealed = [f for f in files if not f.sealed]
    if len(unsealed) < len(files) and finished(storage, cfg, day, files, table):
        late = sum(_size(files[f]) for f in unsealed)
        if len(unsealed) < cfg.reseal_files and late < cfg.reseal_mb * 2**20:
            return None
    if not files:
        return None
    folders: dict[tuple[str, str], list[SealInput]] = defaultdict(list)
    for f, version in sorted(files.items(), key=lambda item: item[0].key):
        folders[f.kind, f.folder].append(
            SealInput(key=f.key, version=version, bytes=_size(version))
        )

    def made(claim: commit.Claim) -> Selection:
        return Selection(
            claim=claim,
            date=day,
            folders=[SealFolder(kind=k, folder=f, inputs=i) for (k, f), i in folders.items()],
            target_bytes=cfg.seal_target_file_mb * 2**20,
            generation=cfg.generation,
            output_schema_json=json.dumps(output_schema(cfg.user_schema or {}), sort_keys=True),
            table=table,
        )

    outside = [commit.Outside(root=table.location, folder=table_folder(day))] if table else []
    return SEAL.claim(storage, topic, newest, run_id, made, cfg.attempt_timeout, outside)


def rewound_files(files: Iterable[DataFile], newest: Token | None) -> list[str]:
    """The run files among `files` at or after the position: a rewind set them back, and the
    next archive run reads their offsets again and replaces them."""
    position = newest.next_offsets if newest else {}
    return sorted(
        f.key for f in files if not f.sealed and f.first_offset >= position.get(f.partition, 0)
    )


def finished(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    files: dict[DataFile, str],
    table: TableTarget | None,
) -> bool:
    """Whether the date's sealed files are those of the seal its proof names, and that seal
    wrote the table `table` (if one is given)."""
    proof = read_proof(storage, cfg, day)
    if proof is None or (table is not None and proof.table != table.identifier):
        return False
    try:
        token = tokens.token_at(storage, cfg.topic, proof.token_seq)
    except (FileNotFoundError, tokens.CorruptToken):
        return False
    return token.kind == "seal" and {f.key for f in files if f.sealed} == set(token.adds)


def seal_folder(
    chosen: Selection,
    index: int,
    codec: str,
    storage: Storage,
    staged: Storage,
    table: Storage | None,
) -> FolderResult:
    """Merge folder `index` of the selection into sealed files of at most its target size, and
    write its parsed records to the table's Parquet files (a Spark task, one per folder).

    Blocks of files written with the folder's schema and `codec` are copied as they are; other
    files' records are re-encoded. Every record is also decoded once, to count which backup
    file's offsets fed the date (the proof) and to fill the table file. Memory: a few blocks,
    one row group and one input file up to `_READ_WHOLE_BYTES`. Names depend only on the
    selection, so a retry writes the same files."""
    folder = chosen.folders[index]
    schema = chosen.schema_of(folder.kind)
    same_schema = canonical(json.dumps(schema))
    decoding = _Decoding(schema)
    result = FolderResult(kind=folder.kind, folder=folder.folder, files=[])
    whole = SourceTally()
    with contextlib.ExitStack() as uploads:
        rows = None
        if table is not None and folder.kind == "partitioned":
            rows = _TableRows(table, chosen, index, uploads, decoding.timestamps)
        chunk, in_chunk = _sealed(chosen, folder, schema, codec, 0), SourceTally()
        for item in folder.inputs:
            part = SourceTally()
            opened = _opener(storage, item)
            with opened() as data:
                header = read_header(data)
                copy = header.codec == codec and canonical(header.schema) == same_schema
                if copy:
                    for count, block in raw_blocks(data, header):
                        chunk.blocks.append_block(count, block)
            with opened() as data:
                sources = _Sources(header, item.key, folder.kind)
                reencoded = None if copy else ReEncoded(schema, codec, item.key)
                for batch in decoding.batches(data, header):
                    for source, partitions, offsets in sources.split(batch):
                        part.add(partitions, offsets, source)
                    if reencoded is not None:
                        for record in batch:
                            reencoded.add(record)
                    if rows is not None:
                        rows.add_all(batch)
                if reencoded is not None:
                    reencoded.copy_to(chunk.blocks)
            in_chunk.merge(part)
            whole.merge(part)
            if chunk.blocks.bytes >= chosen.target_bytes:
                result.files.append(_closed(chunk, in_chunk, staged))
                chunk = _sealed(chosen, folder, schema, codec, len(result.files))
                in_chunk = SourceTally()
        if chunk.blocks.records or not result.files:
            result.files.append(_closed(chunk, in_chunk, staged))
        if rows is not None:
            result.table_files = rows.close()
    result.records_read, result.checksum = whole.records, whole.checksum
    result.spans = whole.spans()
    return result


_READ_WHOLE_BYTES = 16 * 2**20
"""An input up to this size is read with one request, and both passes over it (its blocks, its
records) read it from memory; a larger one (an earlier seal's file) is opened twice, so memory
stays a block."""


def _opener(
    storage: Storage, item: SealInput
) -> Callable[[], contextlib.AbstractContextManager[IO[bytes]]]:
    if item.bytes > _READ_WHOLE_BYTES:
        return lambda: storage.open_read(item.key)
    data = storage.read(item.key)
    return lambda: contextlib.nullcontext(io.BytesIO(data))


_MICROS_PER = {
    "timestamp-millis": 1_000,
    "local-timestamp-millis": 1_000,
    "timestamp-micros": 1,
    "local-timestamp-micros": 1,
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Decoding:
    """Decodes a folder's inputs to its schema, its top-level timestamps as numbers.

    fastavro resolves a writer's schema to a reader's record by record, which costs ~40% more
    than reading with the writer's schema alone, so an input written with the folder's very
    schema (names, types, logical types, docs) is read with its own. And it makes a datetime of
    each timestamp (~0.85 µs a value) that Arrow would only turn back into a number, so such an
    input is read under the same schema without the timestamps' logical types: they stay longs
    (`timestamps`: each field's microseconds per unit), which `_TableRows` makes timestamps
    column-wise and an Avro writer takes as they are."""

    def __init__(self, schema: dict) -> None:
        self.schema = schema
        self.parsed = fastavro.parse_schema(schema)
        self.timestamps: dict[str, int] = {}
        longs = copy.deepcopy(schema)
        for field in longs["fields"]:  # a timestamp, or a timestamp or null (not in a JSON union)
            types = field["type"] if isinstance(field["type"], list) else [field["type"]]
            match [t for t in types if t != "null"]:
                case [{"logicalType": str(logical)} as branch] if logical in _MICROS_PER:
                    self.timestamps[field["name"]] = _MICROS_PER[branch.pop("logicalType")]
        self.longs = json.dumps(longs)
        self.same: dict[str, bool] = {}

    def batches(self, data: IO[bytes], header: Header) -> Iterator[list[dict]]:
        """The file's records in lists of up to 10,000 (the caller counts them column-wise)."""
        same = self.same.get(header.schema)
        if same is None:
            same = fastavro.parse_schema(json.loads(header.schema)) == self.parsed
            self.same[header.schema] = same
        if same:
            read_header(data)
            records = fastavro.reader(with_schema(data, header, self.longs))
        else:
            records = fastavro.reader(data, reader_schema=self.schema)
        while batch := list(itertools.islice(records, 10_000)):
            if not same:
                for record in batch:
                    for name, micros in self.timestamps.items():
                        if (value := record.get(name)) is not None:
                            epoch = _EPOCH if value.tzinfo else _EPOCH.replace(tzinfo=None)
                            record[name] = (value - epoch) // timedelta(microseconds=micros)
            yield batch


def _sealed(
    chosen: Selection, folder: SealFolder, schema: dict, codec: str, n: int
) -> SealedFileWriter:
    key = kind_folder(folder.kind, chosen.claim.topic, folder.folder)
    return SealedFileWriter(key + sealed_file_name(chosen.generation, n), schema, codec)


def _closed(chunk: SealedFileWriter, tally: SourceTally, staged: Storage) -> SealedFile:
    size = chunk.close(staged, tally.spans())
    return SealedFile(key=chunk.key, records=chunk.blocks.records, bytes=size)


def check_inputs(storage: Storage, chosen: Selection) -> None:
    """Raise Fenced or Conflict (permanent) if the seal can no longer commit: a rewind, or
    another seal, a rebuild or a rewind replaced a file it reads; it is then withdrawn (its
    table files go at the next seal's commit, which reaches the table). Its Spark job failing on
    such a file then needs no retry; the date is sealed again from what is there now."""
    with leftovers.refused(storage, chosen.claim):
        chosen.check_live(storage)
        commit.FilesCurrent(chosen.versions()).check(storage, chosen.claim, None)


def save_attempt(storage: Storage, chosen: Selection, folders: list[FolderResult]) -> str:
    """Stage what the Spark job staged, as the attempt's manifest (the commit task reads it),
    while the claim is live (`Attempts.save`)."""
    attempt = SealAttempt(
        topic=chosen.claim.topic,
        attempt_id=chosen.claim.attempt_id,
        folders=folders,
        created_at=datetime.now(UTC),
    )
    return SEAL.save(storage, chosen, attempt)


def commit_seal(
    storage: Storage, cfg: TopicConfig, chosen: Selection, table: leftovers.Remover | None = None
) -> tuple[Token, Proof]:
    """Replace the date's files by the sealed ones through the one commit site, or refuse,
    change nothing and remove what the seal wrote (`table`: what removes its table files).
    Returns the seal's token and the date's proof (without the table's part,
    `cairn.table.iceberg` adds it). Safe to retry: a seal that committed returns its token."""

    def change() -> commit.Change:
        attempt = load_attempt(chosen.staged(storage), chosen.manifest_key)
        _check(storage, chosen, attempt)
        proof = attempt.proof(chosen)
        sealed = Sealed(
            date=chosen.date,
            files_before=proof.files_before,
            files_after=proof.files_after,
            partitioned=proof.partitioned,
            quarantined=proof.quarantined,
            checksum=proof.checksum,
        )
        return commit.replacing(
            chosen.versions(),
            {f.key: f.bytes for f in attempt.sealed},
            SealPayload(generation=chosen.generation, manifest=chosen.manifest_key, sealed=sealed),
        )

    token = SEAL.commit(storage, chosen, change, chosen.reach(table))
    proof = load_attempt(storage, chosen.manifest_key).proof(chosen)
    return token, proof.model_copy(update={"token_seq": token.seq})


def table_files(storage: Storage, chosen: Selection) -> list[TableFile]:
    """The table files of a committed seal (its manifest is in `_manifests/`)."""
    return [t for f in load_attempt(storage, chosen.manifest_key).folders for t in f.table_files]


def _check(storage: Storage, chosen: Selection, attempt: SealAttempt) -> None:
    """Every sealed file is staged with its size, and each folder's sealed files hold exactly
    the records its inputs held."""
    problems = []
    if attempt.attempt_id != chosen.claim.attempt_id:
        problems.append(f"the manifest belongs to {attempt.attempt_id}")
    done = {(f.kind, f.folder): f for f in attempt.folders}
    staged = chosen.staged(storage)
    for folder in chosen.folders:
        result = done.get((folder.kind, folder.folder))
        if result is None:
            problems.append(f"{folder.kind} folder {folder.folder} was not sealed")
            continue
        if sum(f.records for f in result.files) != result.records_read:
            problems.append(f"{folder.folder}: sealed files do not hold the records read")
        for f in result.files:
            named = parse_data_key(f.key)
            if named is None or not named.sealed or named.folder != folder.folder:
                problems.append(f"{f.key} is not a sealed file of {folder.folder}")
            elif not staged.exists(f.key) or staged.size(f.key) != f.bytes:
                problems.append(f"{f.key} is missing or has another size than {f.bytes}")
    if problems:
        raise SealRefused(
            f"{chosen.claim.label} {chosen.date}: {'; '.join(problems[:5])}; nothing was changed"
        )


def _size(version: str) -> int:
    """The size in a `Storage.version`."""
    return int(version.split(":", 1)[0])


_NONE = np.zeros(1, dtype=np.int64)
"""The span ends of a partition an input's header lists no span of (every record is outside)."""


class _Sources:
    """Which backup file a record of one input file came from: its header names it (a run's or
    a rebuild's file), or lists them with their offsets (a file sealed before)."""

    def __init__(self, header: Header, key: str, kind: DataKind) -> None:
        self.one = header.metadata.get("cairn.source")
        self.processing_time = header.metadata.get("cairn.processing_time")
        self.key, self.kind = key, kind
        self.spans: dict[int, list[SourceSpan]] = defaultdict(list)
        for span in sorted(sources_of(header.metadata) or [], key=lambda s: s.first):
            self.spans[span.partition].append(span)
        self.firsts = {p: np.array([s.first for s in v]) for p, v in self.spans.items()}
        self.lasts = {p: np.array([s.last for s in v]) for p, v in self.spans.items()}

    def split(
        self, records: list[dict]
    ) -> Iterator[tuple[tuple[str | None, str | None], np.ndarray, np.ndarray]]:
        """The Kafka partitions and offsets of `records`, by the backup file each came from (its
        key, and the processing time it was parsed with), found column-wise: a resealed date's
        records mostly pass here."""
        names = ("_kafka_partition", "_kafka_offset")
        if self.kind != "partitioned":
            names = ("partition", "offset")
        partitions, offsets = (
            np.fromiter((r[name] for r in records), np.int64, len(records)) for name in names
        )
        if not self.spans:
            yield (self.one, self.processing_time), partitions, offsets
            return
        for partition in np.unique(partitions).tolist():
            mine = offsets[partitions == partition]
            i = np.full(len(mine), -1)
            if partition in self.spans:
                i = np.searchsorted(self.firsts[partition], mine, side="right") - 1
            outside = (i < 0) | (mine > self.lasts.get(partition, _NONE)[i.clip(0)])
            if outside.any():
                raise SealRefused(
                    f"{self.key}: record {partition}@{mine[outside.argmax()]} is in no backup "
                    "file its header lists"
                )
            for n in np.unique(i).tolist():
                span = self.spans[partition][n]
                at = mine[i == n]
                yield (span.source, span.processing_time), np.full(len(at), partition), at


class _TableRows:
    """A folder's parsed records as the table's Parquet files, with the date as `_event_date`."""

    def __init__(
        self,
        table: Storage,
        chosen: Selection,
        index: int,
        uploads: contextlib.ExitStack,
        timestamps: dict[str, int],
    ) -> None:
        self.table, self.chosen, self.index, self.uploads = table, chosen, index, uploads
        self.schema = chosen.table_schema()
        self.timestamps = timestamps
        """The fields that come as numbers (`_Decoding`): their microseconds per unit."""
        self.row_type = pa.struct(
            [
                f.with_type(pa.int64()) if f.name in timestamps else f
                for f in self.schema
                if f.name != EVENT_DATE
            ]
        )
        self.json = json_fields(chosen.schema_of("partitioned"))
        self.rows: list[dict] = []
        self.files: list[TableFile] = []
        self.writer: ParquetFileWriter | None = None

    def add_all(self, records: list[dict]) -> None:
        for name in self.json:
            for record in records:
                if record.get(name) is not None:
                    record[name] = json.dumps(record[name], default=str)
        self.rows.extend(records)
        if len(self.rows) >= 10_000:
            self._flush()

    def close(self) -> list[TableFile]:
        """Finish the table file (its upload completes when the task's uploads do)."""
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.files.append(TableFile(path=self.path, records=self.writer.stats.records))
        return self.files

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.writer is None:
            chosen = self.chosen
            self.path = table_file_name(chosen.date, chosen.claim.attempt_id, self.index, 0)
            out = self.uploads.enter_context(self.table.open_write(self.path))
            self.writer = ParquetFileWriter(out, self.schema, "_kafka_offset")
        # pyarrow converts the dicts to a struct in C++: ~2x faster than column lists in Python
        # (`from_pydict`), which was ~2.4x faster than `from_pylist`.
        rows = iter(pa.array(self.rows, type=self.row_type).flatten())
        arrays = []
        for field in self.schema:
            if field.name == EVENT_DATE:
                arrays.append(pa.repeat(pa.scalar(self.chosen.date, field.type), len(self.rows)))
            elif (micros := self.timestamps.get(field.name)) is not None:
                arrays.append(pc.multiply(next(rows), micros).cast(field.type))
            else:
                arrays.append(next(rows))
        self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self.rows = []


def finish_seal(
    storage: Storage, cfg: TopicConfig, chosen: Selection, table: IcebergCatalog | None
) -> Proof:
    """The seal's commit task: commit the sealed files (`commit_seal`), replace the date in the
    topic's Iceberg table (`table`, the catalog), and write the date's proof; then remove what
    seals that can no longer commit left, in the table's location too, and keep the table
    (`cairn.table.upkeep`). Safe to retry at any point. A seal refused leaves no table file
    behind."""
    from cairn.table import iceberg  # pyiceberg: only in the task that commits to the table
    from cairn.table.upkeep import unreferenced, upkeep

    where = chosen.table if table is not None else None
    files = iceberg.location_storage(table, where) if table is not None and where else None
    remover = unreferenced(table, where, files) if table is not None and where else None
    _, proof = commit_seal(storage, cfg, chosen, remover)
    if where is not None:
        done = iceberg.replace_date(
            table,
            where,
            chosen.table_schema(),
            chosen.date,
            [f.path for f in table_files(storage, chosen)],
            chosen.claim.attempt_id,
            table_summary(proof),
            offset_ranges(proof),
        )
        proof = proof.model_copy(
            update={
                "table": where.identifier,
                "table_records": done.records,
                "snapshot_id": done.snapshot_id,
            }
        )
    write_proof(storage, cfg, proof)
    leftovers.sweep(storage, cfg.topic, chosen.reach(remover))
    if where is not None and files is not None:
        tidied = upkeep(
            table.load_table(where.identifier),
            files,
            chosen.date,
            cfg.table_snapshot_age,
            cfg.attempt_timeout,
        )
        for gone in tidied.expired:
            if gone.date is not None:
                mark_expired(storage, cfg, gone.date, gone.snapshot_id)
    return proof
