"""Rebuilding dates from the backup, against a real local Storage holding an archive committed the
way the pipeline commits it (`archive_run`): claim, stage, verify, commit, publish."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import fastavro
import pytest

from cairn.config import TopicConfig
from cairn.datafiles.avro_file import BACKUP_SCHEMA, millis
from cairn.datafiles.file_entry import FileEntry
from cairn.datafiles.writer import KafkaRecord
from cairn.errors import PermanentError
from cairn.pipeline.rebuild import (
    NoDates,
    RebuildRefused,
    RebuildResult,
    Selection,
    commit_rebuild,
    load_attempt,
    load_claimed,
    rebuild_source,
    run_dates,
    save_attempt,
    select,
    verify_rebuild,
)
from cairn.protocol import commit, leftovers, rewind, tokens
from cairn.protocol.commit import Conflict
from cairn.protocol.manifest import VerificationFailed
from cairn.storage.layout import (
    attempt_prefix,
    event_folder,
    folder_date,
    parse_data_key,
    partitioned_key,
    token_key,
)
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from cairn.views import finder
from cairn.views.audit import audit_date
from cairn.views.finder import ArchiveIndex
from tests.leftovers import rewound_publications, unnamed_data_files
from tests.unit.conftest import archive_records

TOPIC = "orders"
SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "ts", "type": ["null", "string", "long"], "default": None},
    ],
}
D1, D2, D3, D4 = (date(2024, 6, d) for d in (1, 2, 3, 4))
LATE = date(2019, 4, 2)


def config(tmp_path, **extra) -> TopicConfig:
    entry = {
        "topic": TOPIC,
        "format": "json",
        "schema": "order.avsc",
        "event_time": {"field": "ts", "encoding": "iso8601"},
        **extra,
    }
    (tmp_path / "order.avsc").write_text(json.dumps(SCHEMA))
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": [entry]}))
    loaded = load_topics(tmp_path / "topics.yaml")
    assert not loaded.errors
    return loaded.topics[0]


def rec(partition: int, offset: int, ts: str | int | None, id: str | int = "x") -> KafkaRecord:
    """An event at `ts`; "bad" makes a value the parser refuses, None a tombstone."""
    value = None if ts is None else b"{bad" if ts == "bad" else json.dumps({"id": id, "ts": ts})
    encoded = value.encode() if isinstance(value, str) else value
    return KafkaRecord(TOPIC, partition, offset, 1_700_000_000_000 + offset, 0, b"k", encoded)


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


# Three runs over two partitions; events around midnight (UTC), one from 2019 arriving late.
RUNS = [
    (
        at("2024-06-02T01:00"),
        [
            rec(0, 0, "2024-06-01T10:00:00Z"),
            rec(0, 1, "2024-06-01T23:30:00Z"),
            rec(0, 2, "2024-06-02T00:30:00Z"),
            rec(0, 3, "bad"),
            rec(0, 4, "2024-06-02T02:00:00Z"),
            rec(1, 0, "2024-06-01T12:00:00Z"),
            rec(1, 1, "2024-06-02T03:00:00Z"),
            rec(1, 2, "2024-06-02T05:00:00Z"),
        ],
    ),
    (
        at("2024-06-03T00:30"),
        [
            rec(0, 5, "2024-06-02T22:00:00Z"),
            rec(0, 6, "2024-06-03T00:10:00Z"),
            rec(0, 7, None),
            rec(1, 3, "2019-04-02T01:00:00Z"),
            rec(1, 4, "2024-06-02T23:59:00Z"),
            rec(1, 5, "2024-06-03T01:00:00Z"),
        ],
    ),
    (
        at("2024-06-04T09:00"),
        [
            rec(0, 8, "2024-06-03T12:00:00Z"),
            rec(0, 9, "2024-06-04T08:00:00Z"),
            rec(0, 10, "bad"),
            rec(1, 6, "2024-06-04T01:00:00Z"),
        ],
    ),
]


def build_archive(storage: Storage, cfg: TopicConfig) -> None:
    for when, records in RUNS:
        archive_records(storage, cfg, when, records)


def rebuild_all(storage: Storage, cfg: TopicConfig, chosen: Selection) -> list[RebuildResult]:
    """The Spark job's tasks: every source re-derived into the rebuild's staging area."""
    staged = commit.staged(storage, chosen.claim)
    return [rebuild_source(source, cfg, storage, staged) for source in chosen.sources]


@dataclass(frozen=True)
class Done:
    """A committed rebuild: its token, and the files its manifest says it wrote."""

    token: tokens.Token
    files: list[FileEntry]

    @property
    def removed(self) -> list[str]:
        return self.token.replaces

    @property
    def seq(self) -> int:
        return self.token.seq


def finish(
    storage: Storage, cfg: TopicConfig, chosen: Selection, results: list[RebuildResult]
) -> Done:
    """The Spark job's last step (its manifest), then the rebuild DAG's commit task."""
    save_attempt(storage, chosen, results)
    token = commit_rebuild(storage, cfg, chosen)
    return Done(token, load_attempt(storage, token.manifest).files)


def rebuild(storage: Storage, cfg: TopicConfig, *days: date) -> Done | None:
    """One rebuild operation as the rebuild DAG drives it: select, re-derive, commit."""
    chosen = select(storage, cfg, days, "rebuild-run")
    if chosen is None:
        return None
    return finish(storage, cfg, chosen, rebuild_all(storage, cfg, chosen))


def rebuild_seqs(storage: Storage) -> list[int]:
    return [t.seq for t in tokens.list_tokens(storage, TOPIC) if t.kind == "rebuild"]


def read(storage: Storage, key: str) -> list[dict]:
    with storage.open_read(key) as f:
        return list(fastavro.reader(f))


def data_files(storage: Storage) -> dict[str, bytes]:
    """Every data file and its bytes: what a refused rebuild must leave exactly as it was."""
    return {k: storage.read(k) for k in storage.list() if parse_data_key(k)}


def placed(storage: Storage, kind: str) -> dict[str, list[dict]]:
    return {k: read(storage, k) for k in storage.list(f"{kind}/{TOPIC}/")}


def filed_date(key: str) -> date:
    """The date a partitioned or quarantine key is filed under (default path format)."""
    return folder_date(parse_data_key(key).folder.split("/hr=")[0], "dt=%Y-%m-%d")


def day_keys(storage: Storage, day: date) -> list[str]:
    """Keys filed under `day`: its partitioned folders and its quarantine."""
    return [
        k
        for k in storage.list("partitioned/") + storage.list("quarantine/")
        if parse_data_key(k) and filed_date(k) == day
    ]


FIELDS = {
    "backup": ("partition", "offset"),
    "partitioned": ("_kafka_partition", "_kafka_offset"),
    "quarantine": ("partition", "offset"),
}
"""Where each kind of file keeps a record's Kafka partition and offset."""


def coordinates(storage: Storage, kind: str) -> Counter:
    """How often each (partition, offset) appears in `kind`'s files."""
    p, o = FIELDS[kind]
    return Counter((row[p], row[o]) for rows in placed(storage, kind).values() for row in rows)


def where(storage: Storage) -> dict[tuple[int, int], str]:
    """The file holding each parsed or quarantined record."""
    found = {}
    for kind in ("partitioned", "quarantine"):
        p, o = FIELDS[kind]
        for key, rows in placed(storage, kind).items():
            found |= {(row[p], row[o]): key for row in rows}
    return found


def assert_exactly_once(storage: Storage) -> None:
    """Every backup record once in partitioned-or-quarantine, nothing else there."""
    backed_up = coordinates(storage, "backup")
    assert set(backed_up.values()) == {1}
    assert coordinates(storage, "partitioned") + coordinates(storage, "quarantine") == backed_up


def assert_in_place(storage: Storage, cfg: TopicConfig, keys: list[str] | None = None) -> None:
    """The files (all if `keys` is None) hold only records `cfg` files there."""
    for key, rows in placed(storage, "partitioned").items():
        if keys is None or key in keys:
            for row in rows:
                when = row["_event_time"]
                assert event_folder(cfg.path_format, when, cfg.tzinfo) == parse_data_key(key).folder
    for key, rows in placed(storage, "quarantine").items():
        if keys is None or key in keys:
            for row in rows:
                processed = row["processing_time"].astimezone(cfg.tzinfo)
                assert f"dt={processed.date()}" == parse_data_key(key).folder, (key, row)


def test_select_groups_the_dates_files_by_the_backup_file_named_in_their_headers(tmp_path, storage):
    build_archive(storage, config(tmp_path))

    chosen = select(storage, config(tmp_path), [D2], "rebuild-run")

    assert chosen == load_claimed(storage, chosen.claim.key)  # Spark reads it by reference
    assert (chosen.claim.kind, chosen.claim.seq, chosen.dates) == ("rebuild", 4, [D2])
    assert (chosen.claim.base_seq, chosen.claim.base_offsets) == (3, {0: 11, 1: 7})
    backup = {s.key: (s.partition, s.processing_time) for s in chosen.sources}
    assert backup == {
        f"backup/{TOPIC}/partition=0/1_0_{0:020d}.avro": (0, RUNS[0][0]),
        f"backup/{TOPIC}/partition=0/1_0_{5:020d}.avro": (0, RUNS[1][0]),
        f"backup/{TOPIC}/partition=1/1_1_{0:020d}.avro": (1, RUNS[0][0]),
        f"backup/{TOPIC}/partition=1/1_1_{3:020d}.avro": (1, RUNS[1][0]),
    }
    assert sorted(k for s in chosen.sources for k in s.files) == sorted(day_keys(storage, D2))


def test_nothing_filed_under_the_dates_claims_nothing(tmp_path, storage):
    cfg = config(tmp_path)
    assert select(storage, cfg, [D2], "rebuild-run") is None  # no token yet
    build_archive(storage, cfg)

    assert select(storage, cfg, [date(2024, 7, 1)], "rebuild-run") is None
    assert storage.list(f"_claims/{TOPIC}/rebuild/") == []


def test_rebuild_with_the_same_config_rewrites_every_file_byte_for_byte(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    before = data_files(storage)

    done = rebuild(storage, cfg, D2)

    assert done.removed == []  # same generation and parser: the same names
    assert sorted(e.key for e in done.files) == sorted(day_keys(storage, D2))
    assert data_files(storage) == before
    assert (done.token.kind, done.token.rebuilt.dates, done.token.next_offsets) == (
        "rebuild",
        [D2],
        {0: 11, 1: 7},
    )
    assert storage.list("_attempts/") == []


def test_backups_written_before_timestamp_millis_rebuild_to_the_same_files(tmp_path, storage):
    """Backups whose Kafka timestamp is a plain long (Cairn before timestamp-millis) still read:
    each file is read with its own schema, and the rebuild writes today's files from them."""
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    before = data_files(storage)
    old = json.loads(json.dumps(BACKUP_SCHEMA))
    old["fields"] = [f | {"type": "long"} if f["name"] == "timestamp" else f for f in old["fields"]]
    for key in storage.list(f"backup/{TOPIC}/"):
        with storage.open_read(key) as f:
            reader = fastavro.reader(f)
            meta = {k: v for k, v in reader.metadata.items() if not k.startswith("avro.")}
            rows = [r | {"timestamp": millis(r["timestamp"])} for r in reader]
        with storage.open_write(key) as out:
            fastavro.writer(out, old, rows, codec="deflate", metadata=meta)

    done = rebuild(storage, cfg, D1, D2, D3)

    assert done.removed == []
    assert {k: v for k, v in data_files(storage).items() if "backup/" not in k} == {
        k: v for k, v in before.items() if "backup/" not in k
    }


def test_late_date_reads_only_the_backup_file_holding_it(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)

    chosen = select(storage, cfg, [LATE], "rebuild-run")
    [source] = chosen.sources
    assert (source.key, source.partition) == (f"backup/{TOPIC}/partition=1/1_1_{3:020d}.avro", 1)
    [result] = rebuild_all(storage, cfg, chosen)
    assert (result.expected, result.records, result.missing) == (1, 1, [])
    finish(storage, cfg, chosen, [result])

    [key] = day_keys(storage, LATE)
    assert parse_data_key(key).gen == 2
    assert [row["_kafka_offset"] for row in read(storage, key)] == [3]


def test_generation_bump_leaves_only_the_new_generation_in_the_dates(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    old = day_keys(storage, D2)
    others = {k: v for k, v in data_files(storage).items() if k not in old}

    done = rebuild(storage, cfg, D2)

    assert sorted(done.removed) == sorted(old)
    assert {parse_data_key(k).gen for k in day_keys(storage, D2)} == {2}
    assert {k: v for k, v in data_files(storage).items() if k in others} == others
    assert_exactly_once(storage)
    assert_in_place(storage, cfg)


def test_a_record_moved_outside_the_rebuilt_dates_is_written_there_once(tmp_path, storage):
    build_archive(storage, config(tmp_path))  # the topic's timezone was wrong: UTC
    tokyo = config(tmp_path, timezone="Asia/Tokyo")
    d2_before = {k: v for k, v in data_files(storage).items() if k in day_keys(storage, D2)}

    done = rebuild(storage, tokyo, D1)

    # 2024-06-01T23:30Z is June 2, 08:30 in Tokyo: filed under D2 now, in a file of its own
    moved = partitioned_key(TOPIC, 1, 0, 1, "dt=2024-06-02/hr=08")
    assert where(storage)[0, 1] == moved and moved in [e.key for e in done.files]
    assert partitioned_key(TOPIC, 1, 0, 1, "dt=2024-06-01/hr=23") in done.removed
    assert {k: v for k, v in data_files(storage).items() if k in d2_before} == d2_before
    assert_exactly_once(storage)
    assert_in_place(storage, tokyo, [*day_keys(storage, D1), moved])


def test_a_quarantined_record_that_gains_an_event_time_leaves_quarantine(tmp_path, storage):
    strict = config(tmp_path)  # "id" must be a string
    records = [rec(0, 0, "2024-06-02T04:00:00Z"), rec(0, 1, "2024-06-03T05:00:00Z", id=7)]
    archive_records(storage, strict, at("2024-06-02T06:00"), records)
    [quarantined] = storage.list("quarantine/")
    loose = {**SCHEMA, "fields": [{"name": "id", "type": ["string", "long"]}, SCHEMA["fields"][1]]}
    (tmp_path / "loose.avsc").write_text(json.dumps(loose))
    fixed = config(tmp_path, schema="loose.avsc")

    done = rebuild(storage, fixed, D2)  # the quarantine's date

    assert done.removed == [quarantined]
    assert storage.list("quarantine/") == []
    assert where(storage)[0, 1] == partitioned_key(TOPIC, 1, 0, 1, "dt=2024-06-03/hr=05")
    assert_exactly_once(storage)
    assert_in_place(storage, fixed)


def test_a_date_range_rebuilt_as_one_operation_files_its_records_where_the_fix_says(
    tmp_path, storage
):
    build_archive(storage, config(tmp_path))
    late = day_keys(storage, LATE)
    fixed = config(tmp_path, timezone="America/New_York")

    done = rebuild(storage, fixed, D1, D2, D3, D4)

    assert (done.seq, done.token.rebuilt.dates) == (4, [D1, D2, D3, D4])
    assert rebuild_seqs(storage) == [4]
    assert day_keys(storage, LATE) == late  # not in the range: left where it was
    assert_exactly_once(storage)
    assert_in_place(storage, fixed, [k for k in where(storage).values() if k not in late])
    assert storage.list("quarantine/") == [
        f"quarantine/{TOPIC}/dt=2024-06-01/1_0_{3:020d}.avro",  # processed 2024-06-01 21:00 NY
        f"quarantine/{TOPIC}/dt=2024-06-02/1_0_{7:020d}.avro",
        f"quarantine/{TOPIC}/dt=2024-06-04/1_0_{10:020d}.avro",
    ]


def test_rebuilding_the_affected_dates_one_by_one_also_files_every_record_once(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    fixed = config(tmp_path, timezone="America/New_York")
    # Midnight-adjacent events and quarantine move a day back; 2019-04-02T01Z to 2019-04-01.
    for day in (D4, D3, D2, D1, LATE, LATE - timedelta(days=1)):
        rebuild(storage, fixed, day)

    assert_exactly_once(storage)
    assert_in_place(storage, fixed)
    assert day_keys(storage, LATE) == []
    assert rebuild_seqs(storage) == [4, 5, 6, 7, 8, 9]


def test_records_moved_far_away_are_followed_by_later_rebuilds(tmp_path, storage):
    """Epoch seconds read as millis file June events in January 1970."""
    wrong = config(tmp_path, event_time={"field": "ts", "encoding": "epoch_millis"})
    june1, june2 = 1_717_272_000, 1_717_308_000  # 2024-06-01T20:00Z, 2024-06-02T06:00Z
    archive_records(storage, wrong, at("2024-07-15T12:00"), [rec(0, 0, june1), rec(0, 1, june2)])
    jan = date(1970, 1, 20)
    assert len(day_keys(storage, jan)) == 1

    fixed = config(tmp_path, event_time={"field": "ts", "encoding": "epoch_seconds"})
    rebuild(storage, fixed, jan)
    assert day_keys(storage, jan) == []
    assert (len(day_keys(storage, D1)), len(day_keys(storage, D2))) == (1, 1)
    assert_exactly_once(storage)
    assert_in_place(storage, fixed)

    # A second fix (the events were Tokyo time) moves record 0 into June 2 as well.
    tokyo = config(tmp_path, timezone="Asia/Tokyo", event_time=fixed.event_time.model_dump())
    rebuild(storage, tokyo, D1, D2)
    assert day_keys(storage, D1) == []
    assert_exactly_once(storage)
    assert_in_place(storage, tokyo)


def test_a_file_without_its_source_in_the_header_makes_select_refuse(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    [old] = [k for k in day_keys(storage, D2) if k.startswith("partitioned/")][:1]
    with storage.open_read(old) as f:
        reader = fastavro.reader(f)
        schema, rows = reader.writer_schema, list(reader)
    with storage.open_write(old) as out:  # as an older Cairn wrote it: no cairn.* metadata
        fastavro.writer(out, schema, rows)

    with pytest.raises(RebuildRefused, match=f"{old} does not name its backup file"):
        select(storage, config(tmp_path), [D2], "rebuild-run")
    assert storage.list(f"_claims/{TOPIC}/rebuild/") == []


def drop_from_backup(storage: Storage, key: str, offset: int) -> None:
    """Damage a backup file: it loses one record."""
    rows = [row for row in read(storage, key) if row["offset"] != offset]
    with storage.open_write(key) as out:
        fastavro.writer(out, BACKUP_SCHEMA, rows)


def test_a_record_missing_from_the_backup_makes_finish_refuse_and_change_nothing(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    drop_from_backup(storage, f"backup/{TOPIC}/partition=0/1_0_{0:020d}.avro", offset=2)
    cfg = config(tmp_path, generation=2)
    before = data_files(storage)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    results = rebuild_all(storage, cfg, chosen)

    with pytest.raises(RebuildRefused, match=r"1_0_00000000000000000000\.avro lacks offsets \[2\]"):
        finish(storage, cfg, chosen, results)

    assert data_files(storage) == before
    assert storage.list("_attempts/") == []
    assert rebuild_seqs(storage) == []


def test_a_source_left_out_of_the_results_makes_finish_refuse(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    before = data_files(storage)
    chosen = select(storage, cfg, [D2], "rebuild-run")

    with pytest.raises(RebuildRefused, match="a source was not rebuilt"):
        finish(storage, cfg, chosen, rebuild_all(storage, cfg, chosen)[1:])
    assert data_files(storage) == before
    assert storage.list("_attempts/") == []


def test_a_new_file_that_would_replace_an_unselected_one_makes_finish_refuse(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    tokyo = config(tmp_path, timezone="Asia/Tokyo")
    # Where the Tokyo fix moves record 0@1 (see above), a file this rebuild of D1 does not select.
    squatter = partitioned_key(TOPIC, 1, 0, 1, "dt=2024-06-02/hr=08")
    storage.write(squatter, b"copied in by hand")
    before = data_files(storage)

    with pytest.raises(Conflict, match=f"would replace {squatter}"):
        rebuild(storage, tokyo, D1)
    assert data_files(storage) == before
    assert storage.list("_attempts/") == []


def test_rebuilding_twice_changes_nothing(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    rebuild(storage, cfg, D2)
    first = data_files(storage)

    again = rebuild(storage, cfg, D2)

    assert (again.seq, again.removed) == (5, [])
    assert data_files(storage) == first
    assert_exactly_once(storage)


def test_finish_retried_after_a_crash_midway_through_publishing_completes(
    tmp_path, storage, monkeypatch
):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    results = rebuild_all(storage, cfg, chosen)

    real_publish = commit.publish

    def crash(storage_: Storage, token: tokens.Token) -> None:
        if token.attempt_id == chosen.claim.attempt_id:
            raise OSError("connection lost")
        real_publish(storage_, token)

    monkeypatch.setattr(commit, "publish", crash)  # the token is created, then the task dies
    with pytest.raises(OSError):
        finish(storage, cfg, chosen, results)
    monkeypatch.undo()
    prefix = attempt_prefix(TOPIC, chosen.claim.attempt_id)
    first = next(k for k in storage.list(prefix) if parse_data_key(k[len(prefix) :]))
    storage.move(first, first[len(prefix) :])  # ...after publishing one file

    done = finish(storage, cfg, chosen, results)

    assert done.token == tokens.token_at(storage, TOPIC, 4)
    assert {parse_data_key(k).gen for k in day_keys(storage, D2)} == {2}
    assert storage.list("_attempts/") == []
    assert_exactly_once(storage)


def test_files_committed_after_the_snapshot_are_untouched(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    results = rebuild_all(storage, cfg, chosen)
    old = day_keys(storage, D2)
    # Meanwhile an archive run (which settles, and must leave the rebuild's staging alone)
    # commits late data into the same date.
    archive_records(storage, cfg, at("2024-06-04T10:00"), [rec(1, 7, "2024-06-02T06:00:00Z")])
    late = {k: storage.read(k) for k in day_keys(storage, D2) if k not in old}
    assert late

    done = finish(storage, cfg, chosen, results)

    assert sorted(done.removed) == sorted(old)
    assert {k: v for k, v in data_files(storage).items() if k in late} == late
    assert_exactly_once(storage)


@pytest.mark.parametrize("first", ["older", "newer"])
def test_of_two_overlapping_rebuilds_the_first_to_commit_wins_and_the_other_changes_nothing(
    tmp_path, storage, first
):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    attempts = {"older": select(storage, cfg, [D2], "rebuild-run-1")}
    results = {"older": rebuild_all(storage, cfg, attempts["older"])}
    attempts["newer"] = select(storage, cfg, [D1, D2], "rebuild-run-2")
    results["newer"] = rebuild_all(storage, cfg, attempts["newer"])
    second = "newer" if first == "older" else "older"

    done = finish(storage, cfg, attempts[first], results[first])
    after = data_files(storage)
    with pytest.raises(Conflict, match="the files it replaces changed"):
        finish(storage, cfg, attempts[second], results[second])

    assert data_files(storage) == after and rebuild_seqs(storage) == [done.seq]
    assert storage.list(attempt_prefix(TOPIC, attempts[second].claim.attempt_id)) == []
    assert {parse_data_key(k).gen for k in day_keys(storage, D2)} == {2}
    assert_exactly_once(storage)


def test_a_rewind_since_the_selection_makes_the_commit_refuse(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    results = rebuild_all(storage, cfg, chosen)
    rewind.rewind(storage, cfg, None, count=1)
    before = data_files(storage)

    with pytest.raises(Conflict, match="rewound below the position it worked from"):
        finish(storage, cfg, chosen, results)
    assert data_files(storage) == before
    assert rebuild_seqs(storage) == []


def test_a_rewind_of_a_rebuild_keeps_its_files_the_only_copy_named_by_its_manifest(
    tmp_path, storage
):
    """A rewind takes back positions, not a rebuild: the files the rebuild replaced (below the
    position, never read again) are gone, so its own files stay, the only parsed copy of their
    records. A generation bump renames them, so no token names them once a hand rewind deleted
    the rebuild's token; its published manifest still does (`rewound_publications`)."""
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    done = rebuild(storage, cfg, D2)
    storage.delete(token_key(TOPIC, done.seq))  # by hand, the newest token
    archive_records(storage, cfg, at("2024-06-05T01:00"), [rec(0, 11, "2024-06-04T20:00:00Z")])

    assert_exactly_once(storage)
    unnamed = unnamed_data_files(storage, TOPIC)
    assert unnamed == {f.key for f in done.files}
    assert unnamed <= rewound_publications(storage, TOPIC)


def crash_publishing(storage: Storage, monkeypatch, cut: str | None, commit) -> None:
    """`commit()` on `storage`, its task dying at the second `cut` ("move", "delete") of its
    publication (None: it publishes whole)."""
    if cut is None:
        commit()
        return
    real, left = getattr(storage, cut), [1]

    def dies(*args) -> None:
        if not left:
            raise OSError("the commit task died")
        left.pop()
        real(*args)

    monkeypatch.setattr(storage, cut, dies)
    with pytest.raises(OSError):
        commit()
    monkeypatch.undo()


def assert_whole(storage: Storage, cfg: TopicConfig) -> None:
    """Each record in one file, found there, and every date audits clean."""
    assert storage.list("_attempts/") == [] and storage.list("_publishing/") == []
    assert_exactly_once(storage)
    index = ArchiveIndex(storage, TOPIC)
    for r in (r for _, records in RUNS for r in records if r.value is not None):
        found = index.find(r.partition, r.offset)
        assert finder.coordinates(found.output.kind, found.output_record) == (r.partition, r.offset)
    for day in (D1, D2, D3, D4, LATE):
        checked = audit_date(storage, cfg, day)
        assert checked.ok, [checked.problems, [(f.key, f.problems) for f in checked.files]]


@pytest.mark.parametrize("then", ["retried", "swept"])
@pytest.mark.parametrize("how", ["by hand", "tokens rewind"])
@pytest.mark.parametrize("cut", ["move", "delete", None])
def test_a_publication_a_rewind_cut_short_is_finished_never_left_with_records_twice(
    tmp_path, storage, monkeypatch, cut, how, then
):
    """The commit task dies halfway through publishing a rebuild (some new files moved in, or
    every one and some old files deleted) or after it published, then a rewind deletes its
    token: `tokens rewind` finishes the publication before; after a hand rewind, the retry
    (refused, saying so) or the sweep, once the attempt is over, finishes it. Either way it is
    as if it had completed before the rewind: each record in one file, every date clean."""
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    save_attempt(storage, chosen, rebuild_all(storage, cfg, chosen))
    crash_publishing(storage, monkeypatch, cut, lambda: commit_rebuild(storage, cfg, chosen))
    newest = tokens.seqs(storage, TOPIC)[-1]
    if how == "by hand":
        storage.delete(token_key(TOPIC, newest))  # the newest token: the rebuild's
    else:
        assert rewind.rewind(storage, cfg, None, to_seq=newest - 1) == [token_key(TOPIC, newest)]

    if then == "retried":
        with pytest.raises(Conflict, match="published, and a rewind deleted its token since"):
            commit_rebuild(storage, cfg, chosen)
    else:
        later = chosen.claim.due + timedelta(seconds=1)  # over: past its deadline
        left_behind = [chosen.claim.attempt_id] if cut and how == "by hand" else []
        assert leftovers.sweep(storage, TOPIC, now=later) == left_behind

    assert {parse_data_key(k).gen for k in day_keys(storage, D2)} == {2}
    assert_whole(storage, cfg)


def test_a_publication_cut_short_and_rewound_by_hand_is_left_as_it_is_once_a_run_planned_since(
    tmp_path, storage, monkeypatch
):
    """Once another attempt planned on the half-done publication, finishing it could overwrite
    that attempt's files or double its records: the retry is refused naming it, and the sweep
    leaves the data folders as they are (the staging held no record's only copy)."""
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    chosen = select(storage, cfg, [D2], "rebuild-run")
    save_attempt(storage, chosen, rebuild_all(storage, cfg, chosen))
    crash_publishing(storage, monkeypatch, "move", lambda: commit_rebuild(storage, cfg, chosen))
    storage.delete(token_key(TOPIC, tokens.seqs(storage, TOPIC)[-1]))  # by hand
    archive_records(storage, cfg, at("2024-06-05T01:00"), [rec(0, 11, "2024-06-04T20:00:00Z")])
    before = data_files(storage)

    with pytest.raises(commit.HalfPublished, match="since: its publication is left as it is"):
        commit_rebuild(storage, cfg, chosen)
    leftovers.sweep(storage, TOPIC, now=chosen.claim.due + timedelta(seconds=1))
    assert data_files(storage) == before
    assert storage.list("_attempts/") == [] and storage.list("_publishing/") == []


@pytest.mark.parametrize("runs", [1, 2])
def test_find_and_the_audit_follow_a_rebuild_whose_token_a_rewind_took_back(
    tmp_path, storage, runs
):
    """`tokens rewind --count N` takes the rebuild token above the runs with it. The rebuild's
    files below the position stay, the only copy of their records; with 2 runs back, one of them
    is at the position, so the run reading its offsets again replaces it, and rewinding that run
    too leaves no token saying so. Every record is found in the file that holds it now, and every
    date audits clean."""
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    done = rebuild(storage, config(tmp_path, generation=2), D2)
    for again in (3, 4):  # generation 1 again; the second time, the token that replaced it goes
        rewind.rewind(storage, cfg, None, count=runs)
        for when, records in RUNS[-runs:]:
            archive_records(storage, cfg, when + timedelta(days=again), records)

    assert_exactly_once(storage)
    index = ArchiveIndex(storage, TOPIC)
    by = set()
    for r in (r for _, records in RUNS for r in records):
        found = index.find(r.partition, r.offset)
        if r.value is not None:  # a tombstone has no parsed copy
            where = finder.coordinates(found.output.kind, found.output_record)
            assert where == (r.partition, r.offset)
            by.add(found.output.by)
    assert f"rebuild {done.token.attempt_id} (its token rewound)" in by
    for day in (D1, D2, D3, D4, LATE):
        checked = audit_date(storage, cfg, day)
        assert checked.ok, [checked.problems, [(f.key, f.problems) for f in checked.files]]


def test_find_and_the_audit_follow_files_a_run_adopted_after_a_rewind(tmp_path, storage):
    """A run that cannot read rewound offsets again (retention) keeps their files as they are:
    their records are found in them, named by the adopting token, and every date audits clean."""
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    rewind.rewind(storage, cfg, None, count=1)  # by hand: the last run (p0 8..10, p1 6)
    when, records = RUNS[2]
    again = archive_records(
        storage, cfg, when, [r for r in records if r.partition == 1], adopted={0: (8, 11)}
    )

    assert_exactly_once(storage)
    index = ArchiveIndex(storage, TOPIC)
    for r in records:
        found = index.find(r.partition, r.offset).output
        assert found is not None and found.by.startswith(f"token {again.seq}")
        assert found.by.endswith("(adopted)") == (r.partition == 0)
    for day in (D1, D2, D3, D4, LATE):
        checked = audit_date(storage, cfg, day)
        assert checked.ok, [checked.problems, [(f.key, f.problems) for f in checked.files]]


def test_processing_time_topic_keeps_its_folders(tmp_path, storage):
    build_archive(storage, config(tmp_path, time_source="processing", event_time=None))
    cfg = config(tmp_path, time_source="processing", event_time=None, generation=2)
    old = day_keys(storage, D2)

    done = rebuild(storage, cfg, D2)

    assert sorted(done.removed) == sorted(old)
    new = [parse_data_key(k) for k in day_keys(storage, D2)]
    assert [(f.folder, f.gen) for f in new] == [("dt=2024-06-02/hr=01", 2)] * 2 + [
        ("dt=2024-06-02", 2)
    ]
    assert_exactly_once(storage)


def test_raw_topics_have_nothing_to_rebuild(tmp_path, storage):
    raw = config(tmp_path, format="raw", schema=None, event_time=None)
    archive_records(storage, raw, *RUNS[0])  # a raw topic's archive: backup files only
    assert {parse_data_key(k).kind for k in storage.list() if parse_data_key(k)} == {"backup"}

    assert select(storage, raw, [D1, D2], "rebuild-run") is None
    assert storage.list(f"_claims/{TOPIC}/rebuild/") == []


def test_verify_rebuild_catches_missing_resized_and_overlapping_files(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    chosen = select(storage, config(tmp_path), [D1], "rebuild-run")
    staged = commit.staged(storage, chosen.claim)
    results = rebuild_all(storage, config(tmp_path), chosen)
    [entry] = [e for r in results for e in r.files if (e.partition, e.first_offset) == (0, 0)]
    verify_rebuild(staged, [entry])
    missing = entry.key.replace("1_0_", "1_1_")
    for match, bad in {
        "missing": entry.model_copy(update={"key": missing, "partition": 1}),
        "bytes": entry.model_copy(update={"bytes": entry.bytes + 1}),
    }.items():
        with pytest.raises(VerificationFailed, match=match):
            verify_rebuild(staged, [bad])
    second = entry.key.replace(f"{0:020d}", f"{1:020d}")
    staged.write(second, staged.read(entry.key))
    overlapping = entry.model_copy(update={"key": second, "first_offset": 1, "last_offset": 1})
    with pytest.raises(VerificationFailed, match="overlap"):
        verify_rebuild(staged, [entry.model_copy(update={"last_offset": 1}), overlapping])


def test_a_run_rebuilds_its_range_or_else_its_own_date():
    assert run_dates(D1, None, None) == [D1]
    assert run_dates(None, "2024-06-01", "2024-06-03") == [D1, D2, D3]
    assert run_dates(D3, "2024-06-01", "") == [D1]  # one end alone: that date
    assert run_dates(None, None, "2024-06-03") == [D3]


@pytest.mark.parametrize(
    ("own", "first", "last", "why"),
    [
        (D1, "2024-06-03", "2024-06-01", "to_date 2024-06-01 is before from_date 2024-06-03"),
        (None, None, None, "no logical date"),  # a REST or manual run that names no dates
        (D1, "2024-6-1x", None, "must be YYYY-MM-DD"),
    ],
)
def test_dates_no_retry_can_fix_are_a_permanent_error(own, first, last, why):
    with pytest.raises(NoDates, match=why) as raised:
        run_dates(own, first, last)
    assert isinstance(raised.value, PermanentError)
