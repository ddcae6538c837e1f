"""Event-driven runs against the real stack: Kafka's last stable offsets read for many topics in
one request (an open transaction's records not counted), and a `run_on: records` topic's archive
DAG run by the real triggerer's `WaitingRecordsTrigger` — never while the topic is idle, within
its max_delay once records wait (how long they waited on `/cairn/metrics`), after a triggerer
restart with records waiting, and back to back while records keep coming, each record archived
once."""

from __future__ import annotations

import itertools
import re
import time
from datetime import UTC, datetime

from confluent_kafka import Producer

from cairn.kafka.cluster import OffsetsReader
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import run_record
from cairn.pipeline.run_record import RunRecord
from cairn.protocol import tokens
from cairn.storage.objects import Storage
from cairn_airflow.triggers.waiting_records import POLL_SECONDS
from cairn_stack import services
from cairn_stack.demo import create_topic, produce, sample_events
from tests.conftest import E2E_PREFIX, E2E_WATCHED, WATCHED_DELAY
from tests.integration.conftest import read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once
from tests.integration.test_overview_page import fetch

DAG_ID = f"archive__{E2E_WATCHED}"
SCHEDULER_SLACK = 20.0
"""Seconds from an asset event to its queued run, on this loaded machine."""
KEEP_COMING = 45
"""Seconds of one record a second, for several runs of which each takes longer than the
`max_delay` after which the records arriving meanwhile fire the next."""


def test_stable_offsets_of_many_topics_come_from_one_reader_and_skip_open_transactions(kafka):
    create_topic(kafka, "watched.plain", partitions=3)
    create_topic(kafka, "watched.txn", partitions=1)
    produce(kafka, "watched.plain", [b"x"] * 7, partition=2)
    txn = Producer({"bootstrap.servers": kafka, "transactional.id": "watched-test"})
    txn.init_transactions()
    txn.begin_transaction()
    txn.produce("watched.txn", b"open", partition=0)
    txn.flush()
    reader = OffsetsReader(KafkaConf({"bootstrap.servers": kafka}, "test"))

    found = reader.stable_offsets({"watched.plain", "watched.txn", "watched.missing"})

    assert found == {"watched.plain": {0: 0, 1: 0, 2: 7}, "watched.txn": {0: 0}}
    txn.commit_transaction()
    deadline = time.monotonic() + 30  # the coordinator writes the marker a moment later
    while (found := reader.stable_offsets({"watched.txn"})) == {"watched.txn": {0: 0}}:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert found == {"watched.txn": {0: 2}}  # the record and the commit marker


TIMES = ("run_after", "start_date", "end_date")


def at(run: dict, field: str) -> datetime:
    return datetime.fromisoformat(run[field])


def asset_runs(airflow) -> list[dict]:
    return [r for r in airflow.runs(DAG_ID) if r["run_type"] == "asset_triggered"]


def wait_for_tokens(storage: Storage, ends: dict[int, int], timeout: float) -> RunRecord:
    """The run record of the commit that took the topic to `ends` (written just after the
    token)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed = tokens.list_tokens(storage, E2E_WATCHED)
        if committed and committed[-1].next_offsets == ends:
            record = run_record.load(storage, E2E_WATCHED, committed[-1].seq)
            if record is not None:
                return record
        time.sleep(1)
    raise TimeoutError(f"{E2E_WATCHED} not archived to {ends} in {timeout}s")


def test_a_watched_topic_runs_when_records_wait_after_a_restart_and_back_to_back(
    airflow, kafka, s3, stack_settings, cluster_settings
):
    create_topic(kafka, E2E_WATCHED, partitions=2)
    airflow.wait_for_dag(DAG_ID)  # unpaused from here on
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)

    time.sleep(2 * WATCHED_DELAY + 2 * POLL_SECONDS)  # idle: nothing fires
    assert asset_runs(airflow) == []
    # No run at all, unless the daily completion run's minute passed meanwhile.
    assert {r["run_type"] for r in airflow.runs(DAG_ID)} <= {"scheduled"}
    assert all(t.run_id.startswith("scheduled__") for t in tokens.list_tokens(storage, E2E_WATCHED))

    sent = datetime.now(UTC)
    for p in range(2):
        produce(kafka, E2E_WATCHED, sample_events(10, NOW, seed=p), partition=p)
    last = wait_for_tokens(storage, {0: 10, 1: 10}, timeout=600)
    (first,) = asset_runs(airflow)
    queued = datetime.fromisoformat(first["queued_at"])
    # Ten records, far below min_records: the firing waited for max_delay, and no longer.
    assert (
        WATCHED_DELAY
        <= (queued - sent).total_seconds()
        <= (WATCHED_DELAY + 2 * POLL_SECONDS + SCHEDULER_SLACK)
    ), (sent, first)

    # Its records waited at least max_delay (the oldest, from its Kafka timestamp to the commit),
    # and no longer than from before they were sent to the commit.
    (span,) = last.freshness
    assert span.records == 20
    assert WATCHED_DELAY <= span.high <= (last.committed_at - sent).total_seconds() + 1
    token = (cluster_settings.state_dir / "airflow" / "metrics_token").read_text()
    served = fetch(airflow.base + "/cairn/metrics", {"Authorization": f"Bearer {token}"})[2]
    p95 = re.search(rf'cairn_freshness_p95_seconds{{topic="{E2E_WATCHED}"}} ([\d.]+)', served)
    assert p95 and WATCHED_DELAY <= float(p95[1]) <= span.high, served

    time.sleep(WATCHED_DELAY + 2 * POLL_SECONDS)  # archived: idle again, no firing more
    assert len(asset_runs(airflow)) == 1

    (triggerer,) = [s for s in services.airflow(cluster_settings) if s.name == "airflow-triggerer"]
    assert triggerer.stop()
    for p in range(2):
        produce(kafka, E2E_WATCHED, sample_events(5, NOW, seed=10 + p), partition=p)
    time.sleep(WATCHED_DELAY + 2 * POLL_SECONDS)
    assert len(asset_runs(airflow)) == 1  # no triggerer, no firing
    triggerer.start(cluster_settings.start_timeout)
    wait_for_tokens(storage, {0: 15, 1: 15}, timeout=600)

    runs = airflow.wait_for_runs(DAG_ID, timeout=600)
    assert all(r["state"] == "success" for r in runs), runs
    assert len(asset_runs(airflow)) == 2
    assert_exactly_once(read_archive(storage, E2E_WATCHED), all_offsets({0: 15, 1: 15}))

    # Records that keep coming: a firing while a run is on its way (its asset event, the next
    # run's run_after) queues the next run behind it, which Airflow creates as the running one
    # ends, so the runs follow back to back.
    for second in range(KEEP_COMING):
        produce(kafka, E2E_WATCHED, sample_events(1, NOW, seed=100 + second), partition=0)
        time.sleep(1)
    wait_for_tokens(storage, {0: 15 + KEEP_COMING, 1: 15}, timeout=600)
    assert all(r["state"] == "success" for r in airflow.wait_for_runs(DAG_ID, timeout=600))
    runs = sorted(asset_runs(airflow), key=lambda r: at(r, "start_date"))[2:]
    assert len(runs) >= 2, runs
    pairs = list(itertools.pairwise([{k: at(r, k) for k in TIMES} for r in runs]))
    assert all(later["start_date"] >= earlier["end_date"] for earlier, later in pairs), runs
    assert any(later["run_after"] < earlier["end_date"] for earlier, later in pairs), runs
    assert_exactly_once(
        read_archive(storage, E2E_WATCHED), all_offsets({0: 15 + KEEP_COMING, 1: 15})
    )
