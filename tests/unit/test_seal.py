"""Sealing dates on a real local archive root committed the way the pipeline commits it: the
merged files hold exactly the records they replace, the proof counts them, a date is sealed
again only past its threshold, and the table gets the date in one snapshot (pyiceberg's
SqlCatalog on SQLite here; the integration tests use the stack's PostgreSQL)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import date

import fastavro
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from cairn.datafiles import seal_writer
from cairn.datafiles.sealed_file import checksum_share
from cairn.datafiles.writer import KafkaRecord
from cairn.formats.base import output_schema
from cairn.kafka.cluster import TopicState, Watermarks
from cairn.pipeline import completeness, seal
from cairn.pipeline import proof as proof_of
from cairn.protocol import commit, rewind, tokens
from cairn.protocol.plan import plan
from cairn.storage.layout import parse_data_key
from cairn.storage.objects import Storage
from cairn.table import offset_index
from cairn.table.catalog import TableTarget
from cairn.table.iceberg import date_records, date_snapshot
from cairn.views import audit, date_check, finder
from cairn.views.finder import ArchiveIndex
from cairn.views.overview import files_per_date
from tests.unit.conftest import archive_records
from tests.unit.test_rebuild import (
    D1,
    D2,
    D3,
    SCHEMA,
    TOPIC,
    at,
    build_archive,
    config,
    rebuild,
    rec,
)


def complete_through(storage: Storage, day: date) -> None:
    """Mark every date up to `day` complete, as the archive DAG's complete task would."""
    completeness.save_state(storage, completeness.State(topic=TOPIC, through=day))


def sealed(storage: Storage, cfg, day: date, catalog=None, table=None) -> proof_of.Proof | None:
    """One seal as the seal DAG drives it: select, every folder's task, the commit task."""
    chosen = seal.select(storage, cfg, day, "seal-run", table=table)
    if chosen is None:
        return None
    staged = commit.staged(storage, chosen.claim)
    where = Storage(table.location) if table else None
    results = [
        seal_writer.seal_folder(chosen, i, cfg.codec, storage, staged, where)
        for i in range(len(chosen.folders))
    ]
    seal.save_attempt(storage, chosen, results)
    return seal.finish_seal(storage, cfg, chosen, catalog)


def table_in(tmp_path) -> tuple[SqlCatalog, TableTarget]:
    """A catalog (pyiceberg's SqlCatalog on SQLite) and the topic's table target in it."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    catalog = SqlCatalog(
        "cairn", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=warehouse.as_uri()
    )
    return catalog, TableTarget(identifier="cairn.orders", location=(warehouse / "orders").as_uri())


def day_records(storage: Storage, day: date) -> Counter:
    """(kind, partition, offset) of every record in the date's files, as a reader sees them."""
    found: Counter = Counter()
    for key in storage.list():
        f = parse_data_key(key)
        if f is None or f.kind == "backup" or f"dt={day}" not in f.folder:
            continue
        with storage.open_read(key) as data:
            for row in fastavro.reader(data):
                if f.kind == "partitioned":
                    found["p", row["_kafka_partition"], row["_kafka_offset"]] += 1
                else:
                    found["q", row["partition"], row["offset"]] += 1
    return found


def day_files(storage: Storage, day: date) -> list[str]:
    return [
        k
        for k in storage.list()
        if (f := parse_data_key(k)) and f.kind != "backup" and f"dt={day}" in f.folder
    ]


def test_a_complete_date_becomes_one_sealed_file_per_folder_holding_exactly_its_records(
    tmp_path, storage
):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    before, files_before = day_records(storage, D2), day_files(storage, D2)

    proof = sealed(storage, cfg, D2)

    after = day_files(storage, D2)
    assert day_records(storage, D2) == before
    assert all(parse_data_key(k).sealed for k in after)
    assert len(after) == len({parse_data_key(k).folder for k in files_before})
    assert (proof.files_before, proof.files_after) == (len(files_before), len(after))
    assert proof.partitioned == sum(1 for k in before if k[0] == "p")
    assert proof.quarantined == sum(1 for k in before if k[0] == "q")
    shares = sum(checksum_share(p, o) for _, p, o in before)
    assert proof.checksum == str(shares)
    token = commit.newest(storage, TOPIC)
    assert (token.kind, token.sealed.date, token.next_offsets) == ("seal", D2, {0: 11, 1: 7})
    assert proof_of.read_proof(storage, cfg, D2) == proof.model_copy(
        update={"sealed_at": proof_of.read_proof(storage, cfg, D2).sealed_at}
    )
    assert not storage.list("_attempts/")


def test_the_proof_names_every_backup_file_and_offsets_that_fed_the_date(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)

    proof = sealed(storage, cfg, D2)

    sources = {
        (p, s.source, s.first, s.last, s.records) for p, ss in proof.partitions.items() for s in ss
    }
    assert sources == {
        (0, f"backup/{TOPIC}/partition=0/1_0_{0:020d}.avro", 2, 4, 3),
        (0, f"backup/{TOPIC}/partition=0/1_0_{5:020d}.avro", 5, 5, 1),
        (1, f"backup/{TOPIC}/partition=1/1_1_{0:020d}.avro", 1, 2, 2),
        (1, f"backup/{TOPIC}/partition=1/1_1_{3:020d}.avro", 4, 4, 1),
    }


def test_a_date_not_complete_or_already_sealed_is_not_sealed(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D1)

    assert sealed(storage, cfg, D2) is None  # not complete yet
    assert sealed(storage, cfg, D1) is not None
    assert sealed(storage, cfg, D1) is None  # nothing left to seal


def test_late_records_are_sealed_again_only_past_the_threshold_and_never_doubled(tmp_path, storage):
    cfg = config(tmp_path, reseal_files=2)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    sealed(storage, cfg, D2)
    archive_records(storage, cfg, at("2024-06-05T00:00"), [rec(0, 11, "2024-06-02T09:00:00Z")])
    one_late = day_records(storage, D2)

    assert sealed(storage, cfg, D2) is None  # one late file: below reseal_files
    archive_records(storage, cfg, at("2024-06-05T01:00"), [rec(1, 7, "2024-06-02T10:00:00Z")])
    before = day_records(storage, D2)
    proof = sealed(storage, cfg, D2)

    assert len(before) == len(one_late) + 1 and day_records(storage, D2) == before
    assert all(parse_data_key(k).sealed for k in day_files(storage, D2))
    assert proof.partitioned == sum(1 for k in before if k[0] == "p")


def test_a_seal_whose_files_changed_meanwhile_changes_nothing(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    chosen = seal.select(storage, cfg, D2, "seal-run")
    staged = commit.staged(storage, chosen.claim)
    results = [
        seal_writer.seal_folder(chosen, i, cfg.codec, storage, staged, None)
        for i in range(len(chosen.folders))
    ]
    seal.save_attempt(storage, chosen, results)
    other = sealed(storage, cfg, D2)  # another seal of the date commits first
    before = day_records(storage, D2), day_files(storage, D2)

    with pytest.raises(commit.Conflict, match="the files it replaces changed"):
        seal.finish_seal(storage, cfg, chosen, None)

    assert other is not None and (day_records(storage, D2), day_files(storage, D2)) == before
    assert [t.kind for t in tokens.list_tokens(storage, TOPIC)].count("seal") == 1


def test_the_table_gets_the_sealed_date_in_one_snapshot_and_a_second_seal_replaces_it(
    tmp_path, storage
):
    cfg = config(tmp_path, reseal_files=1)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)

    proof = sealed(storage, cfg, D2, catalog, table)

    rows = catalog.load_table("cairn.orders").scan().to_arrow()
    assert proof.table_records == rows.num_rows == proof.partitioned
    assert set(rows.column("_event_date").to_pylist()) == {D2}
    summary = date_snapshot(catalog, TOPIC, D2)
    assert (
        summary["cairn.seq"] == str(proof.token_seq) and summary["cairn.checksum"] == proof.checksum
    )
    offsets = json.loads(summary["cairn.offsets"])
    index = offset_index.load(catalog.load_table("cairn.orders"))
    for p, spans in proof.partitions.items():  # a few ranges that cover what fed the date
        assert len(offsets[str(p)]) <= offset_index.RANGES
        assert all(any(a <= s.first and s.last <= b for a, b in offsets[str(p)]) for s in spans)
    kafka = (rows["_kafka_partition"].to_pylist(), rows["_kafka_offset"].to_pylist())
    for p, o in zip(*kafka, strict=True):
        assert any(a <= o <= b for a, b in index[D2][str(p)])  # the index covers every row
    archive_records(storage, cfg, at("2024-06-05T00:00"), [rec(0, 11, "2024-06-02T09:00:00Z")])
    again = sealed(storage, cfg, D2, catalog, table)
    table_now = catalog.load_table("cairn.orders")
    assert again.table_records == table_now.scan().to_arrow().num_rows == proof.partitioned + 1
    assert table_now.current_snapshot().summary.operation.value == "overwrite"


def test_a_record_a_rebuild_moved_to_another_date_is_in_the_table_once_after_either_seal(
    tmp_path, storage
):
    """A fixed timezone moves 2024-06-01T23:30Z to June 2 (Tokyo). Sealing June 2 takes the
    record out of June 1's partition in the same commit; sealing June 1 again then leaves each
    partition exactly its folder."""
    cfg = config(tmp_path, reseal_files=1)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)
    sealed(storage, cfg, D1, catalog, table)
    tokyo = config(tmp_path, timezone="Asia/Tokyo", reseal_files=1)
    rebuild(storage, tokyo, D1)

    def in_table() -> Counter:
        rows = catalog.load_table("cairn.orders").scan().to_arrow()
        keys = ("_event_date", "_kafka_partition", "_kafka_offset")
        return Counter(zip(*(rows.column(k).to_pylist() for k in keys), strict=True))

    assert in_table()[D1, 0, 1] == 1  # June 1's partition is stale until a seal

    sealed(storage, tokyo, D2, catalog, table)

    assert (D1, 0, 1) not in in_table() and in_table()[D2, 0, 1] == 1
    assert max(Counter((p, o) for _, p, o in in_table()).values()) == 1
    moved = catalog.load_table("cairn.orders").current_snapshot().summary  # one snapshot
    assert moved["cairn.moved-to"] == D2.isoformat() and moved["cairn.date"] == D2.isoformat()

    sealed(storage, tokyo, D1, catalog, table)

    for day in (D1, D2):
        folder = {("p", p, o) for _, p, o in (k for k in in_table() if k[0] == day)}
        assert folder == {k for k in day_records(storage, day) if k[0] == "p"}


def test_a_rebuild_of_a_sealed_date_re_derives_its_records_from_the_backup(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    sealed(storage, cfg, D2)
    before = day_records(storage, D2)

    done = rebuild(storage, config(tmp_path, generation=2), D2)

    assert done.removed and all(parse_data_key(k).sealed for k in done.removed)
    assert day_records(storage, D2) == before
    assert {parse_data_key(k).gen for k in day_files(storage, D2)} == {2}
    assert not any(parse_data_key(k).sealed for k in day_files(storage, D2))


def test_a_rewind_into_a_sealed_date_keeps_the_sealed_records_and_the_cli_refuses_it(
    tmp_path, storage
):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    sealed(storage, cfg, D2)
    state = TopicState("id", {0: Watermarks(0, 11), 1: Watermarks(0, 7)}, False)

    with pytest.raises(rewind.RewindRefused, match="sealed"):
        rewind.rewind(storage, cfg, state, count=2)
    rewind.rewind(storage, cfg, None, count=2)  # by hand: tokens 2 and 3 (and the seal) go
    found = rewind.survey(storage, TOPIC, commit.newest(storage, TOPIC).next_offsets)
    planned = plan(
        "orders",
        commit.newest(storage, TOPIC),
        state.watermarks,
        100,
        "earliest",
        False,
        rewound=rewind.spans(storage, found),
    )

    kept = {f.key for files in found.backups.values() for f in files} & found.sealed_sources
    assert kept and planned.adopted


def test_find_and_the_audit_follow_a_seal_whose_token_a_rewind_took_back(tmp_path, storage):
    """A hand rewind over a seal token keeps the sealed files (the files they replaced are gone):
    the date's records below the position are found in them, and the date audits clean."""
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    records = day_records(storage, D2)
    sealed(storage, cfg, D2)
    seal_token = commit.newest(storage, TOPIC)
    rewind.rewind(storage, cfg, None, count=1)  # by hand: the last run and the seal above it
    position = commit.newest(storage, TOPIC).next_offsets
    index = ArchiveIndex(storage, TOPIC)

    below = [(p, o) for _, p, o in records if o < position[p]]
    assert below and all(
        index.find(p, o).output.by == f"seal {seal_token.attempt_id} (its token rewound)"
        for p, o in below
    )
    checked = audit.audit_date(storage, cfg, D2)
    assert checked.ok, [checked.problems, [(f.key, f.problems) for f in checked.files]]


def test_the_overview_shows_per_date_whether_it_is_sealed_and_its_files_before(tmp_path, storage):
    cfg = config(tmp_path, reseal_files=5)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    files_before = len(day_files(storage, D2))
    proof = sealed(storage, cfg, D2)
    archive_records(storage, cfg, at("2024-06-05T00:00"), [rec(0, 11, "2024-06-02T09:00:00Z")])

    dates = {d.day: d for d in files_per_date(storage, cfg)}

    assert dates[D2].state == "sealed, 1 late file" and dates[D2].files_before == files_before
    assert dates[D2].sealed == proof.files_after and dates[D3].state == "not sealed"


def test_find_files_and_audit_follow_each_record_into_its_sealed_file_and_on_to_a_rebuild(
    tmp_path, storage
):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    records = day_records(storage, D2)
    proof = sealed(storage, cfg, D2)
    index = ArchiveIndex(storage, TOPIC)

    for kind, p, o in records:
        found = index.find(p, o)
        assert (
            found.output.key in day_files(storage, D2) and parse_data_key(found.output.key).sealed
        )
        assert found.output.by == f"seal {proof.token_seq}"
        assert finder.coordinates(found.output.kind, found.output_record) == (p, o)
        assert found.output.kind == ("partitioned" if kind == "p" else "quarantine")
    entries = [index.entry(k) for k in day_files(storage, D2)]
    assert sum(e.entry.records for e in entries) == len(records)
    assert audit.audit_date(storage, cfg, D2).ok

    damaged = next(k for k in day_files(storage, D2) if "dt=" in k and "quarantine" not in k)
    original = storage.read(damaged)
    with storage.open_read(damaged) as f:
        reader = fastavro.reader(f)
        schema, rows = reader.writer_schema, list(reader)
    with storage.open_write(damaged) as out:
        fastavro.writer(out, schema, rows[1:])
    [bad] = [f for f in audit.audit_date(storage, cfg, D2).files if f.problems]
    assert bad.key == damaged and f"seal {proof.token_seq} says {len(rows)}" in bad.problems[0]
    storage.write(damaged, original)

    done = rebuild(storage, config(tmp_path, generation=2), D2)
    index = ArchiveIndex(storage, TOPIC)
    for _, p, o in records:
        found = index.find(p, o)
        assert (
            found.output.by == f"rebuild {done.seq}" and not parse_data_key(found.output.key).sealed
        )


def test_the_table_takes_a_field_the_topic_schema_gained_and_keeps_the_older_dates(
    tmp_path, storage
):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)
    first = sealed(storage, cfg, D1, catalog, table)
    grown = {
        **SCHEMA,
        "fields": [
            *SCHEMA["fields"],
            {"name": "coupon", "type": ["null", "string"], "default": None},
        ],
    }
    (tmp_path / "grown.avsc").write_text(json.dumps(grown))

    second = sealed(storage, config(tmp_path, schema="grown.avsc"), D2, catalog, table)

    rows = catalog.load_table("cairn.orders").scan().to_arrow()
    assert "coupon" in rows.column_names
    by_date = Counter(rows.column("_event_date").to_pylist())
    assert by_date == {D1: first.partitioned, D2: second.partitioned}
    assert set(rows.column("coupon").to_pylist()) == {None}


def test_a_seal_that_stopped_before_its_proof_or_had_no_table_is_sealed_again_whole(
    tmp_path, storage
):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    records = day_records(storage, D2)
    chosen = seal.select(storage, cfg, D2, "seal-run")
    staged = commit.staged(storage, chosen.claim)
    results = [
        seal_writer.seal_folder(chosen, i, cfg.codec, storage, staged, None)
        for i in range(len(chosen.folders))
    ]
    seal.save_attempt(storage, chosen, results)
    seal.commit_seal(storage, cfg, chosen)  # the commit task gave up here: no table, no proof
    assert proof_of.read_proof(storage, cfg, D2) is None

    again = sealed(storage, cfg, D2)
    assert again is not None and day_records(storage, D2) == records
    assert again.partitioned == sum(1 for k in records if k[0] == "p")
    assert sealed(storage, cfg, D2) is None  # finished now

    catalog, table = table_in(tmp_path)
    with_table = sealed(storage, cfg, D2, catalog, table)  # a table now: the date goes in

    assert with_table.table_records == again.partitioned and with_table.table == "cairn.orders"
    assert sealed(storage, cfg, D2, catalog, table) is None


@pytest.mark.parametrize("whole_bytes", [seal_writer._READ_WHOLE_BYTES, 0])
def test_the_table_holds_each_sealed_record_s_values_however_its_inputs_are_read(
    tmp_path, storage, monkeypatch, whole_bytes
):
    """Inputs up to `_READ_WHOLE_BYTES` are read once, larger ones twice; either way the table's
    rows are the sealed records, field by field (a union of several types as JSON)."""
    monkeypatch.setattr(seal_writer, "_READ_WHOLE_BYTES", whole_bytes)
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)
    before = day_records(storage, D2)

    sealed(storage, cfg, D2, catalog, table)

    assert day_records(storage, D2) == before
    records = []
    for key in day_files(storage, D2):
        if parse_data_key(key).kind == "partitioned":
            with storage.open_read(key) as data:
                records.extend(fastavro.reader(data))
    expected = sorted(
        (
            r["_kafka_partition"],
            r["_kafka_offset"],
            r["id"],
            None if r["ts"] is None else json.dumps(r["ts"]),
            r["_event_time"],
            D2,
        )
        for r in records
    )
    rows = catalog.load_table("cairn.orders").scan().to_arrow().to_pylist()
    got = sorted(
        (
            r["_kafka_partition"],
            r["_kafka_offset"],
            r["id"],
            r["ts"],
            r["_event_time"],
            r["_event_date"],
        )
        for r in rows
    )
    assert got == expected and len(got) == sum(1 for k in before if k[0] == "p")


def test_timestamps_reach_the_sealed_files_and_the_table_unchanged_from_either_schema(
    tmp_path, storage
):
    """Inputs of the folder's schema are read with their timestamps as numbers, inputs of an
    older schema are resolved to it; either way every field of every record, timestamps of
    each kind included, is the same in the sealed files and the table as it was before."""
    millis = {"type": "long", "logicalType": "timestamp-millis"}
    older = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "paid", "type": millis}]}
    newer = {
        **older,
        "fields": [
            *older["fields"],
            {
                "name": "seen",
                "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
                "default": None,
            },
            {
                "name": "local",
                "type": ["null", {"type": "long", "logicalType": "local-timestamp-millis"}],
                "default": None,
            },
            {"name": "when", "type": ["null", "string", millis], "default": None},  # JSON
        ],
    }
    for name, schema in (("older", older), ("newer", newer)):
        (tmp_path / f"{name}.avsc").write_text(json.dumps(schema))

    def timed(partition: int, offset: int, hour: int) -> KafkaRecord:
        at_ms = int(at(f"2024-06-02T{hour:02d}:00").timestamp() * 1000) + offset
        value = {"id": f"o{offset}", "ts": f"2024-06-02T{hour:02d}:00:00Z", "paid": at_ms - 1}
        if partition:
            value |= {"seen": at_ms * 1000 + 7, "local": at_ms + 5, "when": at_ms + 9}
        return KafkaRecord(TOPIC, partition, offset, at_ms, 0, b"k", json.dumps(value).encode())

    archive_records(
        storage, config(tmp_path, schema="older.avsc"), at("2024-06-02T05:00"), [timed(0, 0, 1)]
    )
    cfg = config(tmp_path, schema="newer.avsc")
    archive_records(storage, cfg, at("2024-06-02T06:00"), [timed(0, 1, 1), timed(1, 0, 1)])
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)

    def partitioned() -> dict[tuple[int, int], dict]:
        found = {}
        for key in day_files(storage, D2):
            if parse_data_key(key).kind == "partitioned":
                with storage.open_read(key) as data:
                    for r in fastavro.reader(data, reader_schema=output_schema(newer)):
                        found[r["_kafka_partition"], r["_kafka_offset"]] = r
        return found

    before = partitioned()
    assert len(before) == 3 and len({parse_data_key(k).sealed for k in day_files(storage, D2)}) == 1

    sealed(storage, cfg, D2, catalog, table)

    assert partitioned() == before
    rows = catalog.load_table("cairn.orders").scan().to_arrow().to_pylist()
    table_rows = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in rows}
    assert table_rows.keys() == before.keys()
    for key, record in before.items():
        as_json = {k: json.dumps(record[k], default=str) for k in ("ts", "when") if record[k]}
        expected = record | as_json | {"_event_date": D2}
        assert table_rows[key] == expected
    assert before[1, 0]["seen"].microsecond % 1000 == 7  # micros kept
    assert before[1, 0]["local"].tzinfo is None and before[1, 0]["when"].microsecond == 9000


def test_a_proof_whose_table_snapshot_was_expired_says_so_and_verify_tells(tmp_path, storage):
    """With no time travel kept, the next seal's upkeep expires the first date's snapshot: the
    first date's proof records it, and the date's rows stay in the table."""
    cfg = config(tmp_path, table_snapshot_age="0s")
    build_archive(storage, cfg)
    complete_through(storage, D3)
    catalog, table = table_in(tmp_path)
    first = sealed(storage, cfg, D1, catalog, table)

    sealed(storage, cfg, D2, catalog, table)

    proof = proof_of.read_proof(storage, cfg, D1)
    assert proof.snapshot_id == first.snapshot_id and proof.snapshot_expired_at is not None
    assert proof_of.read_proof(storage, cfg, D2).snapshot_expired_at is None
    in_table = catalog.load_table("cairn.orders")
    assert len(in_table.snapshots()) == 1
    assert date_records(in_table, D1) == first.table_records
    check = date_check.verify_date(storage, cfg, D1)
    assert check.sealed.endswith(f"table snapshot {first.snapshot_id} (expired since)")
