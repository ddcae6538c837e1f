"""Checking a date against the backup: `python -m cairn verify TOPIC --date D`.

Independently of how the date was written, this recomputes from the backup which records belong
to date D — every record of the backup files that fed D, parsed again with today's
configuration: filed under D, or quarantined on processing date D — and compares that with what
D's files hold: each exactly once, nothing missing, nothing foreign. For a sealed date it also
checks the proof (`_SEALED`): its counts and checksum against the sealed files, and the table's
count of D against the proof's.

Which backup files fed D: those D's files name in their headers (a run's file names its backup
file; a sealed file lists them), those its proof lists, and those of the runs committed from the
day before D until D was complete (or now) whose manifests placed a file in D — so a file
deleted from D is noticed even when nothing else names its backup file. A config changed since
D was archived makes D's records foreign here: rebuild D first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from cairn.datafiles.avro_file import millis, read_header
from cairn.datafiles.sealed_file import checksum_share, sources_of
from cairn.formats import Registries, open_format
from cairn.formats.base import KafkaCoords, Parsed
from cairn.pipeline.completeness import read_marker
from cairn.pipeline.proof import read_proof
from cairn.pipeline.rebuild import day_versions
from cairn.protocol import manifest, tokens
from cairn.storage.layout import date_folder, file_date, folder_date, parse_data_key
from cairn.storage.objects import Storage
from cairn.views.finder import coordinates, read_records

if TYPE_CHECKING:
    from cairn.config import TopicConfig

SHOWN = 10
"""Offsets named per problem and partition (the count says how many there are)."""


class DateCheck(BaseModel):
    """What `verify_date` found."""

    topic: str
    date: date
    records: int = 0
    partitioned: int = 0
    quarantined: int = 0
    sources: int = 0
    missing: dict[int, list[int]] = Field(default_factory=dict)
    """Backup records whose date is D that D's files do not hold."""
    doubled: dict[int, list[int]] = Field(default_factory=dict)
    """Records D's files hold more than once."""
    foreign: dict[int, list[int]] = Field(default_factory=dict)
    """Records D's files hold that today's configuration files elsewhere (or no backup has)."""
    proof: list[str] = Field(default_factory=list)
    """Where the date's proof disagrees with its files or its table."""
    sealed: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.missing or self.doubled or self.foreign or self.proof)

    def line(self) -> str:
        """The verdict in one line."""
        head = f"topic {self.topic} date {self.date}"
        if self.ok:
            sealed = f"; {self.sealed}" if self.sealed else "; not sealed"
            return (
                f"{head}: OK, every backup record of the date is in it exactly once: "
                f"{self.records} records ({self.partitioned} partitioned, {self.quarantined} "
                f"quarantined) from {self.sources} backup files{sealed}"
            )
        parts = [
            f"{what} {_offsets(found)}"
            for what, found in (
                ("missing", self.missing),
                ("twice", self.doubled),
                ("not of this date", self.foreign),
            )
            if found
        ]
        return f"{head}: MISMATCH: " + "; ".join(parts + self.proof)


def verify_date(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    table_records: Callable[[date], int | None] | None = None,
    registries: Registries | None = None,
    on_file: Callable[[str], None] | None = None,
) -> DateCheck:
    """Check `day` of `cfg.topic` against the backup (module doc). `table_records(day)` counts
    the date in the topic's table, if there is one; `on_file` is told each file read."""
    check = DateCheck(topic=cfg.topic, date=day)
    found: Counter = Counter()
    sources: set[str] = set()
    in_sealed: list[tuple[int, int]] = []
    for f in day_versions(storage, cfg.topic_name, cfg.path_format, day):
        if on_file is not None:
            on_file(f.key)
        with storage.open_read(f.key) as data:
            meta = read_header(data).metadata
        spans = sources_of(meta)
        sources |= {s.source for s in spans or [] if s.source} | {meta.get("cairn.source", "")}
        for row in read_records(storage, f.key):
            coords = coordinates(f.kind, row)
            found[coords] += 1
            check.partitioned += f.kind == "partitioned"
            check.quarantined += f.kind == "quarantine"
            if f.sealed:
                in_sealed.append(coords)
    proof = read_proof(storage, cfg, day)
    if proof is not None:
        sources |= {s.source for spans in proof.partitions.values() for s in spans if s.source}
    sources |= _fed_by_runs(storage, cfg, day)
    sources.discard("")
    expected: set[tuple[int, int]] = set()
    for key in sorted(sources):
        if on_file is not None:
            on_file(key)
        expected |= _of_date(storage, cfg, key, day, registries)
    check.sources, check.records = len(sources), sum(found.values())
    check.missing = _by_partition(expected - set(found))
    check.doubled = _by_partition(c for c, n in found.items() if n > 1)
    check.foreign = _by_partition(set(found) - expected)
    if proof is not None:
        check.proof = _proof_problems(proof, in_sealed, day, table_records)
        table = f", table snapshot {proof.snapshot_id}" if proof.snapshot_id is not None else ""
        table += " (expired since)" if proof.snapshot_expired_at else ""
        check.sealed = f"sealed by token {proof.token_seq}{table}"
    return check


def _of_date(
    storage: Storage, cfg: TopicConfig, key: str, day: date, registries: Registries | None
) -> set[tuple[int, int]]:
    """The records of backup file `key` that today's configuration files under `day`."""
    with storage.open_read(key) as data:
        when = read_header(data).metadata["cairn.processing_time"]  # every data file's
    processing_time = datetime.fromisoformat(when)
    quarantine_day = processing_time.astimezone(cfg.tzinfo).date()
    parser = open_format(cfg, registries)
    found = set()
    for record in read_records(storage, key):
        p, offset = record["partition"], record["offset"]
        coords = KafkaCoords(p, offset, millis(record["timestamp"]))
        result = parser.parse(record["value"], coords, processing_time)
        filed = (
            folder_date(result.folder, cfg.path_format)
            if isinstance(result, Parsed)
            else quarantine_day
        )
        if filed == day:
            found.add((p, offset))
    return found


def _fed_by_runs(storage: Storage, cfg: TopicConfig, day: date) -> set[str]:
    """Backup files of the runs committed from the day before `day` until it was complete (or
    now) whose manifests placed a file in it."""
    folder = date_folder(cfg.path_format, day)
    marker = read_marker(storage, cfg.topic_name, folder) if folder else None
    start = datetime.combine(day - timedelta(days=1), datetime.min.time(), cfg.tzinfo)
    found = set()
    for seq in tokens.seqs(storage, cfg.topic_name):
        token = tokens.read(storage, cfg.topic_name, seq)
        if token is None or token.kind != "archive" or token.manifest is None:
            continue
        if token.planned_at is not None and token.planned_at < start:
            continue
        if marker is not None and seq > marker.token_seq:
            break
        entries = manifest.load(storage, token.manifest).files
        placed = {e.partition for e in entries if _date_of(e.key, cfg) == day}
        found |= {e.key for e in entries if e.kind == "backup" and e.partition in placed}
    return found


def _date_of(key: str, cfg: TopicConfig) -> date | None:
    f = parse_data_key(key)
    return None if f is None else file_date(f, cfg.path_format)


def _proof_problems(
    proof, in_sealed: list[tuple[int, int]], day: date, table_records: Callable | None
) -> list[str]:
    problems = []
    sealed = len(in_sealed)
    if sealed != proof.partitioned + proof.quarantined:
        problems.append(
            f"the sealed files hold {sealed} records, the proof says "
            f"{proof.partitioned + proof.quarantined}"
        )
    if str(sum(checksum_share(p, o) for p, o in in_sealed)) != proof.checksum:
        problems.append("the sealed files' checksum differs from the proof's")
    if table_records is not None and proof.table_records is not None:
        now = table_records(day)
        if now is not None and now != proof.table_records:
            problems.append(
                f"the table holds {now} records of the date, the proof says {proof.table_records}"
            )
    return problems


def _by_partition(coords) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for p, o in sorted(coords):
        grouped.setdefault(p, []).append(o)
    return grouped


def _offsets(found: dict[int, list[int]]) -> str:
    """`partition 0 offsets 5-9, 12 (7 records)`, at most `SHOWN` offsets per partition."""
    parts = []
    for p, offsets in sorted(found.items()):
        shown = ", ".join(map(str, offsets[:SHOWN])) + (" …" if len(offsets) > SHOWN else "")
        n = len(offsets)
        parts.append(f"partition {p} offsets {shown} ({n} record{'s' if n != 1 else ''})")
    return "; ".join(parts)
