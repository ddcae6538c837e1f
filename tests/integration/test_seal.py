"""Sealing against the real services: Kafka, Spark (the seal job), the S3 server and the Iceberg
catalog on PostgreSQL. A complete date becomes one sealed file per folder holding exactly its
records; the table holds them and Spark SQL and pyiceberg read them by name; a crash at any
step retries cleanly; a seal beside an archive run or a rebuild loses and doubles nothing; late
data is sealed again; a rebuild of a sealed date replaces it in the table in one snapshot."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from cairn.cli import main as cli
from cairn.pipeline import completeness, seal
from cairn.pipeline import proof as proofs
from cairn.protocol import commit, tokens
from cairn.storage.layout import parse_data_key
from cairn.table import catalog as catalogs
from cairn.table import iceberg
from cairn_stack.demo import create_topic, produce
from spark_jobs.seal import seal as seal_job
from tests.integration.conftest import read_archive
from tests.integration.test_archive import all_offsets, assert_exactly_once, event

DAY = (datetime.now(UTC) - timedelta(days=3)).date()


def at(h: float) -> datetime:
    return datetime.combine(DAY, datetime.min.time(), UTC) + timedelta(hours=h)


def archived_day(kafka, archiver, make_cfg, topic: str, runs: int = 3, extra: str = ""):
    """`runs` archive runs of a day's events (4 per partition each, two partitions, a poison
    record each run), the day marked complete."""
    create_topic(kafka, topic, partitions=2)
    cfg = make_cfg(topic, "max_records_per_partition: 1000\n" + extra)
    for r in range(runs):
        for p in (0, 1):
            values = [event(r * 100 + p * 10 + i, at(2 + r * 5 + i)) for i in range(4)]
            produce(kafka, topic, [*values, b"{broken"], partition=p)
        archiver.run(cfg)
    storage = archiver.storage(cfg)
    completeness.save_state(storage, completeness.State(topic=topic, through=DAY + timedelta(1)))
    return cfg


def run_seal(archiver, cfg, table_catalog=None, day: date = DAY):
    """One seal as the seal DAG drives it: select, the Spark job, the commit task."""
    storage = archiver.storage(cfg)
    target = iceberg.target(table_catalog, cfg.topic) if table_catalog else None
    chosen = seal.select(storage, cfg, day, f"test-{uuid.uuid4().hex[:6]}", target)
    if chosen is None:
        return None, None
    options = iceberg.storage_options(table_catalog) if table_catalog else {}
    seal_job(archiver.spark, chosen, cfg, archiver.options, options)
    found = iceberg.catalog_of(table_catalog) if table_catalog else None
    return chosen, seal.finish_seal(storage, cfg, chosen, found)


def date_keys(storage, topic: str, day: date = DAY) -> list[str]:
    return [
        k
        for k in storage.list()
        if (f := parse_data_key(k))
        and f.topic == topic
        and f.kind != "backup"
        and f"dt={day}" in f.folder
    ]


def test_a_sealed_date_is_few_files_and_a_table_that_spark_sql_and_pyiceberg_read_by_name(
    kafka, archiver, make_cfg, topic_name, table_catalog, spark
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    before = read_archive(storage, topic_name)
    files_before = date_keys(storage, topic_name)

    _, proof = run_seal(archiver, cfg, table_catalog)

    after = date_keys(storage, topic_name)
    assert len(after) < len(files_before) and all(parse_data_key(k).sealed for k in after)
    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 15, 1: 15}))
    assert sorted(map(str, contents.partitioned)) == sorted(map(str, before.partitioned))
    assert (proof.partitioned, proof.quarantined, proof.table_records) == (24, 0, 24)
    assert proof.files_before == len(files_before) and proof.files_after == len(after)
    table = iceberg.catalog_of(table_catalog).load_table(f"cairn.{catalogs.table_name(topic_name)}")
    rows = table.scan().to_arrow()
    expected = sorted((r["_kafka_partition"], r["_kafka_offset"]) for _, r in before.partitioned)
    got = sorted(
        zip(
            rows.column("_kafka_partition").to_pylist(),
            rows.column("_kafka_offset").to_pylist(),
            strict=True,
        )
    )
    assert got == expected
    summary = table.current_snapshot().summary
    assert summary["cairn.topic"] == topic_name and summary["cairn.seq"] == str(proof.token_seq)
    assert summary.operation.value in ("append", "overwrite")
    for key, value in catalogs.spark_conf(table_catalog).items():
        spark.conf.set(key, value)
    name = catalogs.spark_table(table_catalog, topic_name)
    assert spark.sql(f"SELECT count(*) AS n FROM {name}").first().n == 24
    by_action = spark.sql(f"SELECT action, count(*) AS n FROM {name} GROUP BY action").collect()
    assert {r.action: r.n for r in by_action} == {"view": 24}


@pytest.mark.parametrize("crash", ["after select", "after the spark job", "after the commit"])
def test_a_crash_at_any_step_of_a_seal_retries_without_losing_or_doubling(
    kafka, archiver, make_cfg, topic_name, table_catalog, crash, monkeypatch
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    target = iceberg.target(table_catalog, topic_name)
    chosen = seal.select(storage, cfg, DAY, "crashing", target)
    options = iceberg.storage_options(table_catalog)
    if crash != "after select":
        seal_job(archiver.spark, chosen, cfg, archiver.options, options)
    if crash == "after the commit":  # the commit task dies after the token, before the table
        monkeypatch.setattr(
            iceberg, "replace_date", lambda *a, **k: (_ for _ in ()).throw(OSError("lost"))
        )
        with pytest.raises(OSError):
            seal.finish_seal(storage, cfg, chosen, iceberg.catalog_of(table_catalog))
        monkeypatch.undo()
        proof = seal.finish_seal(storage, cfg, chosen, iceberg.catalog_of(table_catalog))
    else:  # the run is cleared and runs again from select
        _, proof = run_seal(archiver, cfg, table_catalog)

    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 15, 1: 15}))
    assert all(parse_data_key(k).sealed for k in date_keys(storage, topic_name))
    assert proof.table_records == 24
    assert [t.kind for t in tokens.list_tokens(storage, topic_name)].count("seal") == 1


def test_a_seal_beside_an_archive_run_and_a_rebuild_loses_and_doubles_nothing(
    kafka, archiver, make_cfg, topic_name, table_catalog
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    chosen = seal.select(storage, cfg, DAY, "racing", iceberg.target(table_catalog, topic_name))
    seal_job(archiver.spark, chosen, cfg, archiver.options, iceberg.storage_options(table_catalog))
    produce(kafka, topic_name, [event(900, at(20))], partition=0)  # late, into the same date
    archiver.run(cfg)  # an archive run commits meanwhile: it does not stop the seal
    proof = seal.finish_seal(storage, cfg, chosen, iceberg.catalog_of(table_catalog))

    assert proof.partitioned == 24
    late = [k for k in date_keys(storage, topic_name) if not parse_data_key(k).sealed]
    assert len(late) == 1
    rebuilding = archiver.rebuild_selected(make_cfg(topic_name, "generation: 2\n"), DAY)
    again = seal.select(storage, cfg, DAY, "racing-2", iceberg.target(table_catalog, topic_name))
    archiver.commit_rebuild(make_cfg(topic_name, "generation: 2\n"), rebuilding)  # first
    assert again is None or again.folders  # below the threshold, or stale: never both applied
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 16, 1: 15}))


def test_the_seal_that_loses_an_overlap_fails_at_once_with_a_conflict_not_a_retry(
    kafka, archiver, make_cfg, topic_name
):
    """Two seals of one date: the first to commit removes the files the other's Spark job
    still has to read; that job fails with Conflict (permanent), not with Spark's error."""
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    loser = seal.select(storage, cfg, DAY, "loser", None)
    run_seal(archiver, cfg)  # the winner, all steps

    with pytest.raises(commit.Conflict, match=r"the files it replaces changed .* is gone"):
        seal_job(archiver.spark, loser, cfg, archiver.options, {})

    assert all(parse_data_key(k).sealed for k in date_keys(storage, topic_name))


def test_late_data_is_sealed_again_past_the_threshold_and_a_rebuild_replaces_the_date_in_the_table(
    kafka, archiver, make_cfg, topic_name, table_catalog
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name, extra="reseal_files: 2\n")
    storage = archiver.storage(cfg)
    run_seal(archiver, cfg, table_catalog)
    produce(kafka, topic_name, [event(900, at(20))], partition=0)
    archiver.run(cfg)
    assert run_seal(archiver, cfg, table_catalog) == (None, None)  # one late file: not yet
    produce(kafka, topic_name, [event(901, at(21))], partition=1)
    archiver.run(cfg)

    _, resealed = run_seal(archiver, cfg, table_catalog)

    assert resealed.partitioned == resealed.table_records == 26
    assert all(parse_data_key(k).sealed for k in date_keys(storage, topic_name))
    rebuilt_cfg = make_cfg(topic_name, "generation: 2\nreseal_files: 2\n")
    archiver.rebuild(rebuilt_cfg, DAY)
    _, after_rebuild = run_seal(archiver, rebuilt_cfg, table_catalog)
    table = iceberg.catalog_of(table_catalog).load_table(f"cairn.{catalogs.table_name(topic_name)}")
    assert after_rebuild.table_records == table.scan().to_arrow().num_rows == 26
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 16, 1: 16}))
    assert {parse_data_key(k).gen for k in date_keys(storage, topic_name)} == {2}
    assert proofs.read_proof(storage, cfg, DAY).token_seq == commit.newest(storage, topic_name).seq


def test_verify_says_in_one_line_that_a_date_is_whole_and_names_a_deleted_and_a_doubled_file(
    kafka, archiver, make_cfg, topic_name, table_catalog, tmp_path, capsys, monkeypatch
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    other = DAY - timedelta(days=1)  # an unsealed date of the same runs
    produce(kafka, topic_name, [event(700 + i, at(-20 + i)) for i in range(3)], partition=0)
    archiver.run(cfg)
    run_seal(archiver, cfg, table_catalog)
    extra = catalogs.connection_extra(table_catalog)
    conn = {"conn_type": "generic", "login": table_catalog.user, "extra": extra}
    conn["password"] = table_catalog.password.get_secret_value()
    monkeypatch.setenv("AIRFLOW_CONN_CAIRN_CATALOG", json.dumps(conn))
    args = ["--topics-file", str(tmp_path / f"{topic_name}.yaml"), "verify", topic_name]

    assert cli([*args, "--date", DAY.isoformat()]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"topic {topic_name} date {DAY}: OK") and "24 records" in line
    assert "sealed by token" in line and "table snapshot" in line

    victim = next(k for k in date_keys(storage, topic_name, other))
    storage.delete(victim)
    assert cli([*args, "--date", other.isoformat()]) == 1
    verdict = capsys.readouterr().out
    first = parse_data_key(victim).first_offset
    assert f"MISMATCH: missing partition 0 offsets {first} (1 record)" in verdict
    assert f"{victim} is missing" in verdict

    sealed_file = date_keys(storage, topic_name)[0]
    copy = sealed_file.replace("1_sealed_", "9_sealed_")
    storage.write(copy, storage.read(sealed_file))
    assert cli([*args, "--date", DAY.isoformat()]) == 1
    verdict = capsys.readouterr().out
    assert "MISMATCH: twice partition" in verdict and "the proof" in verdict
