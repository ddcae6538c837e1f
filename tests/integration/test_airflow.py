"""Through the real Airflow 3 scheduler, with the Spark connection pointing at a standalone
cluster and the archive on S3: a triggered run archives the topic, and a run stopped by the
per-run cap triggers the next one at once until the backlog is drained."""

from __future__ import annotations

from cairn import tokens
from cairn.storage import Storage
from cairn_stack.demo import create_topic, produce, sample_events
from tests.conftest import E2E_PREFIX, E2E_TOPIC
from tests.integration.conftest import coords, read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once

DAG_ID = "archive__e2e__dot__orders"


def test_triggered_run_drains_the_backlog_on_the_cluster_into_s3(
    airflow, kafka, s3, stack_settings
) -> None:
    create_topic(kafka, E2E_TOPIC, partitions=2)
    for p in range(2):
        produce(kafka, E2E_TOPIC, sample_events(100, NOW, seed=p), partition=p)
    airflow.wait_for_dag(DAG_ID)

    airflow.trigger(DAG_ID)
    runs = airflow.wait_for_runs(DAG_ID, timeout=900)

    assert all(r["state"] == "success" for r in runs), runs
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    committed = tokens.list_tokens(storage, E2E_TOPIC)
    # cap 60 per partition: 100 records each take two runs, the second triggered by the first
    assert [t.next_offsets for t in committed] == [{0: 60, 1: 60}, {0: 100, 1: 100}]
    contents = read_archive(storage, E2E_TOPIC)
    assert_exactly_once(contents, all_offsets({0: 100, 1: 100}))
    assert len(coords(contents.backup)) == 200

    by_run = {t.run_id: t for t in committed}
    summaries = [
        airflow.xcom(DAG_ID, r["dag_run_id"], "commit") for r in runs if r["dag_run_id"] in by_run
    ]
    first = next(s for s in summaries if s["seq"] == 1)
    assert first["ranges"] == {"0": [0, 60], "1": [0, 60]}
    assert first["counts"]["backup"] == 120 and first["more_waiting"] is True
    assert first["offset_lag"] == {"0": 40, "1": 40} and first["time_lag_seconds"] > 0
