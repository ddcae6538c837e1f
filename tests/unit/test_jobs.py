"""What a Spark job is given (`cairn.jobs`): one typed input per job that round-trips through the
environment spark-submit gets, carries the topic's entry with its files, and refuses local
storage on a cluster before any Spark work."""

from __future__ import annotations

import pytest

from cairn.config import TopicConfig
from cairn.jobs import (
    JOB_INPUT_VARIABLE,
    ArchiveInput,
    LocalStorageOnCluster,
    SealInput,
    check_shared,
    from_env,
    to_env,
)

RAW = TopicConfig.model_validate(
    {"topic": "orders", "format": "raw", "archive_root": "s3://c@bucket/x"}
)


def test_a_job_input_round_trips_through_one_environment_variable_with_its_secrets():
    given = ArchiveInput(
        topic=RAW.snapshot(),
        claim="_claims/orders/archive/000000000001-000001.json",
        kafka={
            "bootstrap.servers": "b:9094",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "cairn",
            "sasl.password": "s3cret",
        },
        kafka_label="Airflow connection 'cairn_kafka'",
        artifact="cairn-0123.zip",
    )
    env = to_env(given)

    assert list(env) == [JOB_INPUT_VARIABLE]
    again = from_env(env)
    assert again == given and isinstance(again, ArchiveInput)
    assert (
        again.kafka_conf().describe()
        == "Airflow connection 'cairn_kafka' (bootstrap servers b:9094)"
    )
    assert again.topic.topic().archive_root == "s3://c@bucket/x"
    with pytest.raises(SystemExit, match=JOB_INPUT_VARIABLE):
        from_env({})


def test_local_folders_are_refused_with_a_master_that_is_not_local():
    check_shared("local[4]", [("archive root", "file:///data/archive")])  # one machine: fine
    check_shared("spark://m:7077", [("archive root", "s3://b/x")])
    with pytest.raises(LocalStorageOnCluster) as refused:
        check_shared("yarn", [("archive root", "s3://b/x"), ("table warehouse", "file:///wh")])
    assert str(refused.value).startswith("table warehouse file:///wh is a local folder")
    assert "yarn" in str(refused.value) and "s3://" in str(refused.value)


def test_a_seal_names_its_warehouse_among_the_places_its_executors_write():
    seal = SealInput(topic=RAW.snapshot(), claim="c", table_location="file:///wh")
    assert seal.locations() == [
        ("archive root", "s3://c@bucket/x"),
        ("table warehouse", "file:///wh"),
    ]
    assert SealInput(topic=RAW.snapshot(), claim="c").locations() == [
        ("archive root", "s3://c@bucket/x")
    ]
