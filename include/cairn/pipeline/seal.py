"""Sealing: a complete date of a topic becomes a few large files, its partition of the topic's
Iceberg table, and a proof of completeness.

A seal is an attempt (`cairn.protocol.attempt`, `SEAL`), step by step (the seal DAG runs them;
`seal_folder`, in `cairn.datafiles.seal_writer`, runs on Spark executors, one task per folder):
`select` lists the date's files with their versions and claims the attempt; `seal_folder` merges
a folder's files block by block into `<gen>_sealed_<n>.avro` files in the attempt's staging, each
naming in its header the backup files and offsets its records came from, and decodes each record
once for the table's Parquet files and the proof's counts; `finish_seal` commits (`commit_seal`),
replaces the date in the table (`cairn.table.iceberg`), writes the proof `_SEALED` and keeps the
table (`cairn.table.upkeep`).

docs/table.md says what sealing does and why (backup files are not merged, late data, the table,
the proof); docs/protocol.md describes the commit protocol a seal goes through.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
from pydantic import PositiveInt

from cairn.datafiles.avro_file import QUARANTINE_SCHEMA
from cairn.datafiles.parquet_file import EVENT_DATE, avro_to_arrow
from cairn.datafiles.seal_writer import (
    FolderResult,
    SealedFile,
    SealFolder,
    SealInput,
    SealRefused,
    TableFile,
)
from cairn.datafiles.sealed_file import SourceSpan
from cairn.formats.base import output_schema
from cairn.pipeline import completeness
from cairn.pipeline.proof import (
    Proof,
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
from cairn.storage.layout import DataFile, parse_data_key, table_folder
from cairn.storage.objects import Storage
from cairn.table.catalog import TableTarget

if TYPE_CHECKING:
    from cairn.config import TopicConfig
    from cairn.table.iceberg import IcebergCatalog

log = logging.getLogger(__name__)


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
        f.key
        for f in files
        if f.partition is not None and f.offset >= position.get(f.partition, 0)  # not sealed
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
        token = tokens.token_at(storage, cfg.topic_name, proof.token_seq)
    except (FileNotFoundError, tokens.CorruptToken):
        return False
    return token.kind == "seal" and {f.key for f in files if f.sealed} == set(token.adds)


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
    files = remover = None
    if table is not None and where is not None:
        files = iceberg.location_storage(table, where)
        remover = unreferenced(table, where, files)
    _, proof = commit_seal(storage, cfg, chosen, remover)
    if table is not None and where is not None:
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
    leftovers.sweep(storage, cfg.topic_name, chosen.reach(remover))
    if table is not None and where is not None and files is not None:
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
